//! The systems under test, behind one interface: a file with a preallocated region that
//! can be written (durably, for Cairn and the host file system) and read at an offset.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// One system's test file.
pub trait Target {
    /// Write all of `buf` at `off`; durable on return when the system promises that.
    fn write(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Read exactly `buf.len()` bytes at `off`.
    fn read(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Called before each measured run.
    fn settle(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Fill `buf` with a deterministic non-zero pattern.
pub fn pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

/// Write `len` bytes of pattern in 1 MiB pieces through `write`.
pub fn preallocate(t: &dyn Target, len: u64) -> io::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let n = (len - off).min(buf.len() as u64) as usize;
        pattern(&mut buf[..n], off + 1);
        t.write(&buf[..n], off)?;
        off += n as u64;
    }
    Ok(())
}

/// A Cairn file: `File::write_at` (durable on return) and `File::read_at`.
pub struct CairnTarget<'a> {
    pub fs: &'a cairn::Fs,
    pub file: cairn::File,
    pub path: PathBuf,
}

impl<'a> CairnTarget<'a> {
    pub fn create(fs: &'a cairn::Fs, path: PathBuf) -> io::Result<CairnTarget<'a>> {
        let file = cairn::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(fs, &path)?;
        Ok(CairnTarget { fs, file, path })
    }
}

impl Target for CairnTarget<'_> {
    fn write(&self, mut buf: &[u8], mut off: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.file.write_at(buf, off)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            buf = &buf[n..];
            off += n as u64;
        }
        Ok(())
    }

    fn read(&self, mut buf: &mut [u8], mut off: u64) -> io::Result<()> {
        while !buf.is_empty() {
            let n = self.file.read_at(buf, off)?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            buf = &mut buf[n..];
            off += n as u64;
        }
        Ok(())
    }

    /// Digest the log, so every run starts with an empty log (writes) or with the data in
    /// the shared area (reads).
    fn settle(&self) -> io::Result<()> {
        self.fs.digest()
    }
}

impl Drop for CairnTarget<'_> {
    fn drop(&mut self) {
        let _ = self.fs.remove_file(&self.path);
    }
}

/// A host file: `pwrite` (+ `fdatasync` when `sync`) and `pread`.
pub struct HostTarget {
    pub file: std::fs::File,
    pub path: PathBuf,
    pub sync: bool,
}

impl HostTarget {
    pub fn create(path: PathBuf, sync: bool) -> io::Result<HostTarget> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        Ok(HostTarget { file, path, sync })
    }
}

impl Target for HostTarget {
    fn write(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.file.write_all_at(buf, off)?;
        if self.sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn read(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }

    /// Make the preallocated region durable before measuring.
    fn settle(&self) -> io::Result<()> {
        if self.sync {
            self.file.sync_all()?;
        }
        Ok(())
    }
}

impl Drop for HostTarget {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_target_roundtrip_and_cleanup() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t");
        {
            let t = HostTarget::create(p.clone(), true).unwrap();
            preallocate(&t, 3 << 20).unwrap();
            t.settle().unwrap();
            let mut w = vec![0u8; 4096];
            pattern(&mut w, 7);
            t.write(&w, 8192).unwrap();
            let mut r = vec![0u8; 4096];
            t.read(&mut r, 8192).unwrap();
            assert_eq!(r, w);
            assert_eq!(std::fs::metadata(&p).unwrap().len(), 3 << 20);
        }
        assert!(!p.exists());
    }
}
