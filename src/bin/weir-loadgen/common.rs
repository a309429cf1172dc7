//! What both senders use: the targets, how requests are split among them, the HTTP client,
//! and percentiles.

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Each target's push URL, `<target>/api/v1/push`. A target must be an `http://` or
/// `https://` URL: `127.0.0.1:8080` alone would otherwise fail every request, one by one.
pub fn push_urls(targets: &[String]) -> anyhow::Result<Vec<String>> {
    targets
        .iter()
        .map(|target| {
            let url = reqwest::Url::parse(target).map_err(|err| {
                anyhow::anyhow!("--target {target:?} is not a URL ({err}); write it as http://{target}")
            })?;
            anyhow::ensure!(
                matches!(url.scheme(), "http" | "https") && url.host().is_some(),
                "--target {target:?} must start with http:// or https:// and name a host, e.g. http://{target}"
            );
            Ok(format!("{}/api/v1/push", target.trim_end_matches('/')))
        })
        .collect()
}

/// A once-a-second progress line on stderr: written over the last on a terminal, one line
/// each otherwise (a log, a pipe), so a captured run reads line by line.
pub fn progress(line: std::fmt::Arguments<'_>) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprint!("\r{line}   ");
    } else {
        eprintln!("{line}");
    }
}

/// Ends the progress lines: on a terminal the last is still open.
pub fn progress_done() {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprintln!();
    }
}

/// The client both modes send with. `idle` is how many idle connections to keep per host.
pub fn http_client(timeout: Duration, idle: usize) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .timeout(timeout)
        .pool_max_idle_per_host(idle)
        // Retire idle connections before weir closes them (its idle keep-alive timeout is
        // --http-header-read-timeout, 30 s by default): reusing one just as the server closes
        // it fails the request ("connection closed before message completed"), as the soak
        // saw once in 8.4 M requests.
        .pool_idle_timeout(Duration::from_secs(20))
        .build()?)
}

/// A transport error with its causes ("error sending request: client error (Connect): tcp
/// connect error: Connection refused"), since reqwest's own text names only the outermost.
pub fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Route {
    RoundRobin,
    Random,
}

/// Which target request `index` goes to: smooth weighted round robin (deterministic) or a
/// weighted random draw.
pub struct Splitter {
    schedule: Vec<(f64, Vec<f64>)>,
    current: Vec<f64>,
    route: Route,
    rng: StdRng,
}

/// Targets found unreachable with `--failover`.
pub type Down = Arc<Vec<std::sync::atomic::AtomicBool>>;

impl Splitter {
    pub fn new(first: Vec<f64>, later: Vec<(f64, Vec<f64>)>, route: Route, seed: u64) -> Self {
        let mut schedule = vec![(0.0, first)];
        schedule.extend(later);
        schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
        let targets = schedule[0].1.len();
        Splitter {
            schedule,
            current: vec![0.0; targets],
            route,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed),
        }
    }

    /// The next target; targets marked down get no share (unless all are down).
    pub fn pick(&mut self, elapsed_seconds: f64, down: &[bool]) -> usize {
        let scheduled = &self
            .schedule
            .iter()
            .rev()
            .find(|(at, _)| *at <= elapsed_seconds)
            .expect("schedule starts at 0")
            .1;
        let mut weights: Vec<f64> = scheduled
            .iter()
            .zip(down)
            .map(|(weight, down)| if *down { 0.0 } else { *weight })
            .collect();
        if weights.iter().sum::<f64>() == 0.0 {
            // The split sends nothing to the live targets: spread evenly over them.
            weights = down
                .iter()
                .map(|down| if *down { 0.0 } else { 1.0 })
                .collect();
            if weights.iter().sum::<f64>() == 0.0 {
                weights = scheduled.clone();
            }
        }
        let total: f64 = weights.iter().sum();
        if self.route == Route::Random {
            let mut draw = self.rng.random_range(0.0..total);
            for (target, weight) in weights.iter().enumerate() {
                if draw < *weight {
                    return target;
                }
                draw -= weight;
            }
            return weights.iter().rposition(|w| *w > 0.0).unwrap_or(0);
        }
        for (current, weight) in self.current.iter_mut().zip(&weights) {
            *current += weight;
        }
        let (best, _) = self
            .current
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .expect("at least one target");
        self.current[best] -= total;
        best
    }
}

pub fn parse_weights(text: &str, targets: usize) -> anyhow::Result<Vec<f64>> {
    let weights: Vec<f64> = text
        .split(',')
        .map(|w| w.trim().parse::<f64>())
        .collect::<Result<_, _>>()?;
    check_weights(&weights, targets)?;
    Ok(weights)
}

pub fn check_weights(weights: &[f64], targets: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        weights.len() == targets,
        "a split needs one weight per target ({targets}), got {}",
        weights.len()
    );
    anyhow::ensure!(
        weights.iter().all(|w| w.is_finite() && *w >= 0.0) && weights.iter().sum::<f64>() > 0.0,
        "split weights must be ≥ 0 and not all 0"
    );
    Ok(())
}

pub fn percentile(sorted: &[u64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(sorted[index] as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_need_a_scheme() {
        let err = push_urls(&["127.0.0.1:8080".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("http://127.0.0.1:8080"), "{err}");
        // `localhost:8080` parses as a URL with the scheme `localhost`.
        assert!(push_urls(&["localhost:8080".into()]).is_err());
        assert_eq!(
            push_urls(&["http://127.0.0.1:8080/".into()]).unwrap(),
            ["http://127.0.0.1:8080/api/v1/push"]
        );
    }

    #[test]
    fn splitter_follows_weights_and_schedule() {
        let mut splitter = Splitter::new(
            vec![70.0, 20.0, 10.0],
            vec![(10.0, vec![0.0, 0.0, 1.0])],
            Route::RoundRobin,
            1,
        );
        let mut counts = [0; 3];
        let up = [false; 3];
        for _ in 0..1000 {
            counts[splitter.pick(0.0, &up)] += 1;
        }
        assert_eq!(counts, [700, 200, 100]);
        assert!((0..100).all(|_| splitter.pick(10.0, &up) == 2));
    }

    #[test]
    fn random_route_follows_weights_roughly() {
        let mut splitter = Splitter::new(vec![70.0, 20.0, 10.0], vec![], Route::Random, 7);
        let mut counts = [0; 3];
        for _ in 0..10_000 {
            counts[splitter.pick(0.0, &[false; 3])] += 1;
        }
        assert!((6700..7300).contains(&counts[0]), "{counts:?}");
        assert!((800..1200).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn down_targets_get_no_share() {
        let mut splitter = Splitter::new(vec![1.0, 1.0, 1.0], vec![], Route::RoundRobin, 1);
        let down = [false, true, false];
        assert!((0..100).all(|_| splitter.pick(0.0, &down) != 1));
        // A split that sends everything to a down target spreads over the live ones.
        let mut splitter = Splitter::new(vec![0.0, 1.0, 0.0], vec![], Route::RoundRobin, 1);
        let mut counts = [0; 3];
        for _ in 0..100 {
            counts[splitter.pick(0.0, &down)] += 1;
        }
        assert_eq!(counts, [50, 0, 50]);
    }

    #[test]
    fn weights_are_checked() {
        assert!(parse_weights("1,2", 3).is_err());
        assert!(parse_weights("0,0", 2).is_err());
        assert!(parse_weights("-1,2", 2).is_err());
        assert_eq!(parse_weights("1, 2", 2).unwrap(), vec![1.0, 2.0]);
    }
}
