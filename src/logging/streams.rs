//! Where log lines are written: one stream (stderr), or with `--log-text-split-stream` /
//! `--log-json-split-stream` info lines to stdout and errors to stderr, the info lines
//! optionally buffered (`--log-*-info-buffer-size`) and flushed every `--log-flush-frequency`
//! and at exit. As component-base: the single stream is stderr for both formats; in text
//! format a line goes to stderr unless it is an info line (klog's `I`: here info, debug and
//! trace), so warnings go to stderr; in JSON format only errors do (klog writes warnings as
//! info messages there).

use std::io::{self, Stderr, Stdout, Write};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LoggingFormat;

/// The stream a line goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// stdout, with split streams.
    Info,
    /// stderr.
    Error,
}

/// The stream of a line at `level`.
pub fn stream_for(format: LoggingFormat, split: bool, level: Level) -> Stream {
    let to_stderr = match format {
        _ if !split => true,
        LoggingFormat::Text => level <= Level::WARN,
        LoggingFormat::Json => level == Level::ERROR,
    };
    if to_stderr {
        Stream::Error
    } else {
        Stream::Info
    }
}

/// Info lines kept in memory up to a size, like Go's `bufio.Writer` under upstream's
/// buffered writer: a line that does not fit flushes the buffer first, a line as large as the
/// buffer is written directly, so no line is ever split.
#[derive(Debug)]
pub struct InfoBuffer<W: Write> {
    out: W,
    buf: Vec<u8>,
    capacity: usize,
}

impl<W: Write> InfoBuffer<W> {
    pub fn new(out: W, capacity: usize) -> Self {
        Self {
            out,
            buf: Vec::with_capacity(capacity),
            capacity,
        }
    }

    pub fn write_line(&mut self, line: &[u8]) -> io::Result<()> {
        if self.buf.len() + line.len() > self.capacity {
            self.flush()?;
        }
        if line.len() >= self.capacity {
            return self.out.write_all(line);
        }
        self.buf.extend_from_slice(line);
        Ok(())
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            self.out.write_all(&self.buf)?;
            self.buf.clear();
        }
        self.out.flush()
    }

    #[cfg(test)]
    fn into_inner(self) -> W {
        self.out
    }
}

type SharedBuffer = Arc<Mutex<InfoBuffer<Stdout>>>;

/// Locks the buffer; a panic while it was held leaves whole lines in it, still good to write.
fn lock(buffer: &Mutex<InfoBuffer<Stdout>>) -> MutexGuard<'_, InfoBuffer<Stdout>> {
    buffer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `MakeWriter` of the log layer: picks each line's stream from its level.
#[derive(Debug, Clone)]
pub struct Outputs {
    format: LoggingFormat,
    split: bool,
    info_buffer: Option<SharedBuffer>,
}

impl Outputs {
    /// Without split streams the buffer size is not used, as upstream.
    pub fn new(format: LoggingFormat, split: bool, info_buffer_size: usize) -> Self {
        let info_buffer = (split && info_buffer_size > 0)
            .then(|| Arc::new(Mutex::new(InfoBuffer::new(io::stdout(), info_buffer_size))));
        Self {
            format,
            split,
            info_buffer,
        }
    }

    /// Writes the buffered info lines every `period` from a thread of its own, and once more
    /// when the returned guard is dropped.
    pub fn start_flushing(&self, period: Duration) -> FlushGuard {
        if let Some(buffer) = &self.info_buffer {
            let buffer = Arc::clone(buffer);
            // Without the thread, lines wait for the buffer to fill or for the exit.
            let _ = std::thread::Builder::new()
                .name("log-flush".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(period);
                        let _ = lock(&buffer).flush();
                    }
                });
        }
        FlushGuard(self.info_buffer.clone())
    }
}

/// Flushes the info buffer when dropped: hold it until the process exits.
#[derive(Debug)]
#[must_use = "the buffered info lines are written when the guard is dropped"]
pub struct FlushGuard(Option<SharedBuffer>);

impl Drop for FlushGuard {
    fn drop(&mut self) {
        if let Some(buffer) = &self.0 {
            let _ = lock(buffer).flush();
        }
    }
}

/// The writer of one line.
pub enum LineWriter<'a> {
    Stderr(Stderr),
    Stdout(Stdout),
    Buffered(&'a Mutex<InfoBuffer<Stdout>>),
}

impl Write for LineWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        match self {
            LineWriter::Stderr(w) => w.write(bytes),
            LineWriter::Stdout(w) => w.write(bytes),
            LineWriter::Buffered(b) => lock(b).write_line(bytes).map(|()| bytes.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            LineWriter::Stderr(w) => w.flush(),
            LineWriter::Stdout(w) => w.flush(),
            // Flushed by the period and at exit: that is the point of the buffer.
            LineWriter::Buffered(_) => Ok(()),
        }
    }
}

impl<'a> MakeWriter<'a> for Outputs {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter::Stderr(io::stderr())
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        match (
            stream_for(self.format, self.split, *meta.level()),
            &self.info_buffer,
        ) {
            (Stream::Error, _) => LineWriter::Stderr(io::stderr()),
            (Stream::Info, Some(buffer)) => LineWriter::Buffered(buffer),
            (Stream::Info, None) => LineWriter::Stdout(io::stdout()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_stream_is_stderr_and_split_streams_follow_component_base() {
        use LoggingFormat::{Json, Text};
        use Stream::{Error, Info};
        for (format, split, level, stream) in [
            (Text, false, Level::TRACE, Error),
            (Text, false, Level::INFO, Error),
            (Json, false, Level::INFO, Error),
            (Text, true, Level::TRACE, Info),
            (Text, true, Level::DEBUG, Info),
            (Text, true, Level::INFO, Info),
            (Text, true, Level::WARN, Error),
            (Text, true, Level::ERROR, Error),
            (Json, true, Level::DEBUG, Info),
            (Json, true, Level::INFO, Info),
            (Json, true, Level::WARN, Info),
            (Json, true, Level::ERROR, Error),
        ] {
            assert_eq!(
                stream_for(format, split, level),
                stream,
                "{format:?} split={split} {level}"
            );
        }
    }

    #[test]
    fn the_info_buffer_keeps_whole_lines_until_full_or_flushed() {
        let mut b = InfoBuffer::new(Vec::new(), 10);
        b.write_line(b"1234\n").unwrap();
        b.write_line(b"abcd\n").unwrap();
        assert!(b.out.is_empty(), "10 bytes fit");
        // The next line does not fit: the buffer is written first, whole.
        b.write_line(b"xy\n").unwrap();
        assert_eq!(b.out, b"1234\nabcd\n");
        // A line as large as the buffer goes out directly, after what was buffered.
        b.write_line(b"0123456789ABC\n").unwrap();
        assert_eq!(b.out, b"1234\nabcd\nxy\n0123456789ABC\n");
        b.write_line(b"z\n").unwrap();
        b.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(b.into_inner(), b"1234\nabcd\nxy\n0123456789ABC\nz\n");
    }

    #[test]
    fn the_buffer_is_used_only_with_split_streams() {
        assert!(
            Outputs::new(LoggingFormat::Text, false, 1024)
                .info_buffer
                .is_none()
        );
        assert!(
            Outputs::new(LoggingFormat::Text, true, 0)
                .info_buffer
                .is_none()
        );
        assert!(
            Outputs::new(LoggingFormat::Json, true, 1024)
                .info_buffer
                .is_some()
        );
    }
}
