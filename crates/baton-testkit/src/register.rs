//! [`FencedRegister`]: a resource that rejects writes carrying a stale fence.
//!
//! This is what a lock's fence is for: the protected resource remembers the largest fence
//! it has seen and refuses writes with a smaller one, so a holder that was paused past its
//! TTL cannot overwrite the work of the holder that came after it. Tests write to one
//! through [`ContenderLog::write`](crate::history::ContenderLog::write), which records
//! every write and its answer for [`check::stale_fences`](crate::check::stale_fences).
//!
//! The register holds a counter (`value`) so a test can also do an unfenced
//! read-modify-write under the lock and detect lost updates as doubled effects.
//!
//! Two backends: [`FencedRegister::in_memory`] for the tasks of one process, and
//! [`FencedRegister::file`] for several processes on one host (the state lives in a JSON
//! file replaced atomically under an exclusive `flock` of a sibling `.lock` file, so a
//! writer killed mid-write leaves the previous state intact).

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use baton_core::Fence;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// The answer to one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRecord {
    /// The register's sequence number of this write, from zero: its linearization order.
    pub order: u64,
    /// The fence the write carried.
    pub fence: u64,
    /// The value it wrote (or tried to).
    pub value: u64,
    /// Whether it was accepted: its fence was at least the largest accepted before it.
    pub accepted: bool,
}

/// The register's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterState {
    /// The largest fence accepted so far.
    pub max_fence: Option<u64>,
    /// The last accepted value (zero before any write).
    pub value: u64,
    /// How many writes arrived, accepted or not.
    pub writes: u64,
    /// How many of them were rejected as stale.
    pub rejected: u64,
}

impl RegisterState {
    fn apply(&mut self, fence: Fence, value: u64) -> WriteRecord {
        let fence = fence.get();
        let accepted = self.max_fence.is_none_or(|max| fence >= max);
        let record = WriteRecord {
            order: self.writes,
            fence,
            value,
            accepted,
        };
        self.writes += 1;
        if accepted {
            self.max_fence = Some(fence);
            self.value = value;
        } else {
            self.rejected += 1;
        }
        record
    }
}

/// A fenced resource: accepts a write only with a fence at least as large as every fence
/// it accepted before, and counts the writes it rejected.
#[derive(Debug)]
pub struct FencedRegister {
    name: String,
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Memory(Mutex<RegisterState>),
    File { state: PathBuf, lock: PathBuf },
}

impl FencedRegister {
    /// A register shared by the tasks of this process.
    pub fn in_memory(name: impl Into<String>) -> Self {
        FencedRegister {
            name: name.into(),
            backend: Backend::Memory(Mutex::new(RegisterState::default())),
        }
    }

    /// A register kept in the file `path`, shared by every process that opens the same
    /// path. The file (and `path.lock`) is created empty if absent.
    pub fn file(name: impl Into<String>, path: impl AsRef<Path>) -> Self {
        let state = path.as_ref().to_path_buf();
        let mut lock = state.clone().into_os_string();
        lock.push(".lock");
        FencedRegister {
            name: name.into(),
            backend: Backend::File {
                state,
                lock: PathBuf::from(lock),
            },
        }
    }

    /// The register's name, as recorded in histories.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current state.
    ///
    /// # Panics
    /// When a file register cannot be read (the test cannot go on).
    pub fn state(&self) -> RegisterState {
        self.with_state(|state| *state)
    }

    /// The last accepted value.
    ///
    /// # Panics
    /// As [`FencedRegister::state`].
    pub fn read(&self) -> u64 {
        self.state().value
    }

    /// Writes `value` if `fence` is at least the largest fence accepted so far.
    ///
    /// # Panics
    /// When a file register cannot be read or written (the test cannot go on).
    pub fn write(&self, fence: Fence, value: u64) -> WriteRecord {
        self.with_state(|state| state.apply(fence, value))
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut RegisterState) -> T) -> T {
        match &self.backend {
            Backend::Memory(state) => f(&mut state.lock().unwrap_or_else(|p| p.into_inner())),
            Backend::File { state, lock } => with_file_state(state, lock, f)
                .unwrap_or_else(|e| panic!("fenced register {}: {e}", state.display())),
        }
    }
}

fn with_file_state<T>(
    path: &Path,
    lock: &Path,
    f: impl FnOnce(&mut RegisterState) -> T,
) -> std::io::Result<T> {
    let lock_file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(lock)?;
    let _held = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| std::io::Error::from(errno))?;
    let mut state = match fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => serde_json::from_str(&text)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?,
        Ok(_) => RegisterState::default(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => RegisterState::default(),
        Err(e) => return Err(e),
    };
    let before = state;
    let answer = f(&mut state);
    if state != before {
        let mut tmp = path.to_path_buf().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        serde_json::to_writer(File::create(&tmp)?, &state)?;
        fs::rename(&tmp, path)?;
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(n: u64) -> Fence {
        Fence::new(n)
    }

    #[test]
    fn stale_fences_are_rejected_and_counted() {
        let r = FencedRegister::in_memory("r");
        assert!(r.write(fence(5), 1).accepted);
        assert!(
            r.write(fence(5), 2).accepted,
            "an equal fence is the same holder"
        );
        let stale = r.write(fence(4), 3);
        assert!(!stale.accepted);
        assert_eq!(stale.order, 2);
        assert!(r.write(fence(9), 4).accepted);
        assert_eq!(
            r.state(),
            RegisterState {
                max_fence: Some(9),
                value: 4,
                writes: 4,
                rejected: 1
            }
        );
    }

    #[test]
    fn file_registers_share_state_between_handles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("register.json");
        let a = FencedRegister::file("r", &path);
        let b = FencedRegister::file("r", &path);
        assert_eq!(a.read(), 0);
        assert!(a.write(fence(3), 1).accepted);
        assert!(!b.write(fence(2), 2).accepted);
        let third = b.write(fence(3), 2);
        assert!(third.accepted);
        assert_eq!(third.order, 2);
        assert_eq!(a.read(), 2);
        assert_eq!(a.state().rejected, 1);
    }
}
