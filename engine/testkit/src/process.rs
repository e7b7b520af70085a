//! Local server processes behind a URL, for the real-server tests that
//! freeze (SIGSTOP) or kill a ClickHouse replica to see what spate does.
//!
//! Linux only: it reads `/proc` (`proc(5)`: `/proc/net/tcp`, `/proc/net/tcp6`
//! and `/proc/<pid>/fd`).

/// The pid of the process listening on `url`'s port on this machine, from
/// `/proc` (the listening socket's inode in `/proc/net/tcp*`, then the
/// process holding it among `/proc/<pid>/fd`); `None` when not found (no
/// port in `url`, nothing listening, or the listener is not ours to see).
pub fn server_pid(url: &str) -> Option<u32> {
    let port: u16 = url.trim_end_matches('/').rsplit(':').next()?.parse().ok()?;
    let inodes = listening_inodes(port);
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// The `socket:[inode]` link targets of the sockets listening (state `0A`)
/// on `port`, IPv4 and IPv6.
fn listening_inodes(port: u16) -> Vec<String> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(&state), Some(&inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let local_port = local
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if state == "0A" && local_port == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    inodes
}

/// Servers frozen with SIGSTOP; SIGCONT on drop (also when the test
/// panics), so no failure leaves a server stopped.
#[derive(Debug)]
pub struct Frozen(Vec<u32>);

impl Frozen {
    /// SIGSTOPs the servers listening on `urls`; panics naming the URL when
    /// one is not a local process or `kill` fails (the guard still thaws
    /// those already stopped).
    pub fn stop(urls: &[String]) -> Frozen {
        let mut frozen = Frozen(Vec::new());
        for url in urls {
            let pid = server_pid(url)
                .unwrap_or_else(|| panic!("no local process listens on {url} (SIGSTOP)"));
            assert!(send(pid, "-STOP"), "kill -STOP {pid} ({url})");
            frozen.0.push(pid);
        }
        frozen
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        for &pid in &self.0 {
            send(pid, "-CONT");
        }
    }
}

/// `kill SIG PID` (`sig` as `kill` spells it: `-STOP`, `-CONT`, `-KILL`);
/// whether it succeeded. Never panics (it runs in a `Drop`, where a panic
/// while panicking aborts): prints the failure to stderr instead.
pub fn send(pid: u32, sig: &str) -> bool {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("kill {sig} {pid} failed");
    }
    ok
}
