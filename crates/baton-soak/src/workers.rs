//! The parent's side of the worker processes: start, pause, resume, kill and replace them,
//! and wait for them at the end.
//!
//! Each worker runs the `soak` binary itself with the hidden `worker` subcommand, its
//! output going to `logs/w<slot>.<incarnation>.log` in the run directory. A slot keeps its
//! number when its process is killed and replaced; the replacement is the next
//! incarnation, with a new process id (and so new holders and new history).

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use baton_testkit::process;

use crate::plan::StoreKind;
use crate::workload::RunDir;

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The `soak` binary.
    pub exe: PathBuf,
    /// The store under test (which contenders the workers run).
    pub store: StoreKind,
    /// The store URL the workers use.
    pub url: String,
    /// The run directory.
    pub dir: RunDir,
    /// The run's seed.
    pub seed: u64,
    /// How long idempotency records live.
    pub record_ttl: Duration,
}

struct Slot {
    child: Child,
    incarnation: u32,
    paused: bool,
}

/// How one worker process ended.
#[derive(Debug, Clone)]
pub struct Exit {
    /// The slot.
    pub worker: u32,
    /// The incarnation.
    pub incarnation: u32,
    /// The process id.
    pub pid: u32,
    /// Its exit status, or `None` when it had to be killed at the end.
    pub status: Option<ExitStatus>,
    /// Whether the nemesis killed it (its exit status then says nothing).
    pub killed_by_nemesis: bool,
}

/// The worker processes of a run.
pub struct Workers {
    command: WorkerCommand,
    slots: Vec<Slot>,
    exits: Vec<Exit>,
}

impl Workers {
    /// Starts `count` workers.
    ///
    /// # Errors
    /// When a process cannot be started.
    pub fn start(command: WorkerCommand, count: u32) -> io::Result<Workers> {
        let mut workers = Workers {
            command,
            slots: Vec::new(),
            exits: Vec::new(),
        };
        for worker in 0..count {
            let child = workers.spawn(worker, 0)?;
            workers.slots.push(Slot {
                child,
                incarnation: 0,
                paused: false,
            });
        }
        Ok(workers)
    }

    fn spawn(&self, worker: u32, incarnation: u32) -> io::Result<Child> {
        let log = self
            .command
            .dir
            .logs()
            .join(format!("w{worker}.{incarnation}.log"));
        let out = File::create(&log)?;
        Command::new(&self.command.exe)
            .arg("worker")
            .arg("--store")
            .arg(self.command.store.name())
            .arg("--url")
            .arg(&self.command.url)
            .arg("--dir")
            .arg(self.command.dir.root())
            .arg("--worker")
            .arg(worker.to_string())
            .arg("--incarnation")
            .arg(incarnation.to_string())
            .arg("--seed")
            .arg(self.command.seed.to_string())
            .arg("--record-ttl-secs")
            .arg(self.command.record_ttl.as_secs().to_string())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
    }

    /// Waits until every worker has connected (written its ready marker).
    ///
    /// # Errors
    /// When one has exited or not connected in time, with the end of its log.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        for worker in 0..self.slots.len() as u32 {
            let marker = self.command.dir.ready_marker(worker, 0);
            loop {
                if marker.exists() {
                    break;
                }
                let slot = &mut self.slots[worker as usize];
                if let Ok(Some(status)) = slot.child.try_wait() {
                    return Err(format!(
                        "worker w{worker} exited with {status} before it was ready:\n{}",
                        self.log_tail(worker, 0)
                    ));
                }
                if Instant::now() >= deadline {
                    return Err(format!(
                        "worker w{worker} was not ready within {timeout:?}:\n{}",
                        self.log_tail(worker, 0)
                    ));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The end of a worker's log.
    pub fn log_tail(&self, worker: u32, incarnation: u32) -> String {
        let path = self
            .command
            .dir
            .logs()
            .join(format!("w{worker}.{incarnation}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("--- {} ---\n{tail}", path.display())
    }

    fn slot(&mut self, worker: u32) -> io::Result<&mut Slot> {
        self.slots
            .get_mut(worker as usize)
            .ok_or_else(|| io::Error::other(format!("no worker w{worker}")))
    }

    /// The process id of worker `worker`.
    pub fn pid(&self, worker: u32) -> Option<u32> {
        self.slots.get(worker as usize).map(|s| s.child.id())
    }

    /// Suspends worker `worker` (SIGSTOP).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause(&mut self, worker: u32) -> io::Result<()> {
        let slot = self.slot(worker)?;
        process::pause(slot.child.id()).map_err(io::Error::from)?;
        slot.paused = true;
        Ok(())
    }

    /// Resumes worker `worker` (SIGCONT).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&mut self, worker: u32) -> io::Result<()> {
        let slot = self.slot(worker)?;
        process::resume(slot.child.id()).map_err(io::Error::from)?;
        slot.paused = false;
        Ok(())
    }

    /// Kills worker `worker` (SIGKILL) and reaps it; answers its process id.
    ///
    /// # Errors
    /// When it cannot be killed.
    pub fn kill(&mut self, worker: u32) -> io::Result<u32> {
        let slot = self.slot(worker)?;
        let pid = slot.child.id();
        let _ = slot.child.kill();
        let status = slot.child.wait()?;
        let incarnation = slot.incarnation;
        slot.paused = false;
        self.exits.push(Exit {
            worker,
            incarnation,
            pid,
            status: Some(status),
            killed_by_nemesis: true,
        });
        Ok(pid)
    }

    /// Starts the next incarnation of worker `worker` (after [`Workers::kill`]); answers
    /// its process id.
    ///
    /// # Errors
    /// When it cannot be started.
    pub fn replace(&mut self, worker: u32) -> io::Result<u32> {
        let incarnation = self.slot(worker)?.incarnation + 1;
        let child = self.spawn(worker, incarnation)?;
        let pid = child.id();
        let slot = self.slot(worker)?;
        slot.child = child;
        slot.incarnation = incarnation;
        Ok(pid)
    }

    /// Resumes every paused worker (a safety net at the end of the fault schedule).
    pub fn resume_all(&mut self) {
        for slot in &mut self.slots {
            if slot.paused {
                let _ = process::resume(slot.child.id());
                slot.paused = false;
            }
        }
    }

    /// Waits up to `timeout` for every worker to exit, kills those still running, and
    /// answers how every worker process of the run ended.
    pub fn wait_all(&mut self, timeout: Duration) -> Vec<Exit> {
        self.resume_all();
        let deadline = Instant::now() + timeout;
        for (worker, slot) in self.slots.iter_mut().enumerate() {
            let status = loop {
                match slot.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    _ => {
                        let _ = slot.child.kill();
                        let _ = slot.child.wait();
                        break None;
                    }
                }
            };
            self.exits.push(Exit {
                worker: worker as u32,
                incarnation: slot.incarnation,
                pid: slot.child.id(),
                status,
                killed_by_nemesis: false,
            });
        }
        std::mem::take(&mut self.exits)
    }

    /// The log tails of the worker processes that failed.
    pub fn failures(&self, exits: &[Exit]) -> Vec<String> {
        exits
            .iter()
            .filter(|e| !e.killed_by_nemesis && !e.status.is_some_and(|s| s.success()))
            .map(|e| {
                let how = match e.status {
                    Some(status) => format!("exited with {status}"),
                    None => "did not finish in time and was killed".to_owned(),
                };
                format!(
                    "worker w{}.{} (pid {}) {how}\n{}",
                    e.worker,
                    e.incarnation,
                    e.pid,
                    self.log_tail(e.worker, e.incarnation)
                )
            })
            .collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            let _ = slot.child.kill();
            let _ = slot.child.wait();
        }
    }
}
