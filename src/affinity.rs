//! Pinning the HTTP workers to cores (`--http-pin-workers`): worker *i* runs only on the
//! *i*-th CPU this process may use, so a request, its forward upstream and its answer stay on
//! the core whose caches hold them.
//!
//! At moderate load a core idles between requests, and the scheduler wakes a worker on
//! whichever core is idle: about one migration a request at 200 requests/s, each starting the
//! request with cold caches. Pinned, the same load cost 22 % less CPU a request (median of five
//! interleaved pairs, `docs/mimir-side-by-side.md`). By default (`auto`) only a process given
//! its own cores is pinned; on a machine of its own, `on` says so.
//!
//! [`plan`] decides, from the CPUs the process may use; the system calls are at the bottom.

/// When the HTTP workers are pinned (`--http-pin-workers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum PinWorkers {
    /// Pin when the process was given its cores: it may use only some of the machine's CPUs
    /// (`taskset`, a cpuset, Kubernetes' static CPU manager), exactly as many as there are
    /// workers. A process that may run anywhere on the machine shares it with whatever else
    /// runs there, and the scheduler's choice of an idle core is worth more.
    #[default]
    Auto,
    /// Pin worker *i* to the *i*-th allowed CPU, round robin when there are more workers: for
    /// a machine of its own.
    On,
    /// Leave the workers to the scheduler.
    Off,
}

/// The CPU each of `workers` is pinned to (by index), or `None` to leave them to the
/// scheduler. `cpus`: the CPUs the process may use, in order, empty when not known; `online`:
/// how many the machine has.
pub fn plan(mode: PinWorkers, cpus: &[usize], online: usize, workers: usize) -> Option<Vec<usize>> {
    if cpus.is_empty() || workers == 0 {
        return None;
    }
    match mode {
        PinWorkers::Off => None,
        PinWorkers::Auto if cpus.len() != workers || cpus.len() >= online => None,
        PinWorkers::Auto | PinWorkers::On => {
            Some((0..workers).map(|i| cpus[i % cpus.len()]).collect())
        }
    }
}

/// The CPUs the calling thread may run on, in order; empty where that cannot be read.
#[cfg(target_os = "linux")]
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a plain bit set, zeroed, of the size passed; the kernel writes at most
    // that many bytes, and CPU_ISSET reads within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

#[cfg(not(target_os = "linux"))]
pub fn allowed_cpus() -> Vec<usize> {
    Vec::new()
}

/// How many CPUs the machine has online; 0 where that cannot be read.
#[cfg(target_os = "linux")]
pub fn online_cpus() -> usize {
    // SAFETY: sysconf reads a value and touches no memory of ours.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(online).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
pub fn online_cpus() -> usize {
    0
}

/// Pins the calling thread to `cpu`.
#[cfg(target_os = "linux")]
pub fn pin_current_thread(cpu: usize) -> std::io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("CPU {cpu} is past the kernel's set"),
        ));
    }
    // SAFETY: as in `allowed_cpus`; `cpu` is within the set, checked above.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn pin_current_thread(_cpu: usize) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "pinning threads is only built for Linux",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_pins_a_worker_to_each_core_given() {
        // Two of eight CPUs given, two workers.
        assert_eq!(plan(PinWorkers::Auto, &[2, 5], 8, 2), Some(vec![2, 5]));
        // The whole machine (shared with whatever else runs on it), more CPUs than workers,
        // or more workers than CPUs: left to the scheduler.
        assert_eq!(plan(PinWorkers::Auto, &[0, 1], 2, 2), None);
        assert_eq!(plan(PinWorkers::Auto, &[0, 1, 2, 3], 8, 2), None);
        assert_eq!(plan(PinWorkers::Auto, &[0, 1], 8, 3), None);
    }

    #[test]
    fn on_pins_round_robin_and_off_never() {
        assert_eq!(plan(PinWorkers::On, &[0, 1], 2, 3), Some(vec![0, 1, 0]));
        assert_eq!(plan(PinWorkers::On, &[0, 1, 2, 3], 4, 2), Some(vec![0, 1]));
        assert_eq!(plan(PinWorkers::Off, &[2, 5], 8, 2), None);
        // Nothing known about the CPUs: nothing to pin to.
        assert_eq!(plan(PinWorkers::On, &[], 2, 2), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_pinned_runs_on_its_core_only() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty(), "sched_getaffinity read nothing");
        let last = *cpus.last().unwrap();
        let seen = std::thread::spawn(move || {
            pin_current_thread(last).unwrap();
            allowed_cpus()
        })
        .join()
        .unwrap();
        assert_eq!(seen, vec![last]);
        assert!(pin_current_thread(libc::CPU_SETSIZE as usize).is_err());
    }
}
