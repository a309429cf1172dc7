//! Real programs (nginx, Prometheus, vmagent, weir) started by a test and stopped when it
//! ends, however it ends; and their logs shown when it fails.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A child process stopped when the test ends: SIGTERM (nginx's master then stops its
/// workers; SIGKILL would orphan them), SIGKILL if it lingers past 5 s.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prints the last `lines` of each of `files` (under `dir`) if the test fails, since the
/// programs' logs say why.
pub struct DumpLogsOnFailure {
    pub dir: PathBuf,
    pub files: &'static [&'static str],
    pub lines: usize,
}

impl Drop for DumpLogsOnFailure {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for name in self.files {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(self.lines).collect();
            eprintln!("--- {name} (last lines)");
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}
