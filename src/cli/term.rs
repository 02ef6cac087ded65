//! What reaches a terminal: every string that came from a file (tensor names, metadata keys and
//! values, error messages that quote them) goes through [`escape`] first, so a crafted name can
//! neither move the cursor, set the title (ESC and OSC sequences), reorder text (bidi controls)
//! nor break the one-line error into several. JSON output is left exact (serde escapes it).

/// A run of non-space characters longer than this is cut, keeping its start and its length.
pub const MAX_RUN: usize = 160;

/// Whether `c` is shown as an escape: C0 and C1 controls, DEL, and the bidi overrides.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with control characters as `\xNN` (`\u{NNNN}` above 0xff) and every run of more than
/// [`MAX_RUN`] non-space characters cut to its first 96 and its length.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut run: Vec<char> = Vec::new();
    let flush = |run: &mut Vec<char>, out: &mut String| {
        if run.len() > MAX_RUN {
            let bytes: usize = run.iter().map(|c| c.len_utf8()).sum();
            out.extend(run[..96].iter().flat_map(|&c| shown(c)));
            out.push_str(&format!("...[{bytes} bytes]"));
        } else {
            out.extend(run.iter().flat_map(|&c| shown(c)));
        }
        run.clear();
    };
    for c in s.chars() {
        if c == ' ' {
            flush(&mut run, &mut out);
            out.push(' ');
        } else {
            run.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// A writer that escapes each complete line it is given (and the rest when flushed or dropped).
pub struct Escaping<W: std::io::Write> {
    out: W,
    line: Vec<u8>,
}

impl<W: std::io::Write> Escaping<W> {
    /// Escape what is written to `out`.
    pub fn new(out: W) -> Self {
        Escaping {
            out,
            line: Vec::new(),
        }
    }

    fn emit(&mut self, upto: usize) -> std::io::Result<()> {
        let rest = self.line.split_off(upto);
        let text = String::from_utf8_lossy(&self.line);
        let (body, nl) = match text.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (&text[..], ""),
        };
        self.out.write_all(escape(body).as_bytes())?;
        self.out.write_all(nl.as_bytes())?;
        self.line = rest;
        Ok(())
    }
}

impl<W: std::io::Write> std::io::Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        while let Some(i) = self.line.iter().position(|&b| b == b'\n') {
            self.emit(i + 1)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if !self.line.is_empty() {
            self.emit(self.line.len())?;
        }
        self.out.flush()
    }
}

impl<W: std::io::Write> Drop for Escaping<W> {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

fn shown(c: char) -> Vec<char> {
    if !hidden(c) {
        return vec![c];
    }
    let code = c as u32;
    if code <= 0xff {
        format!("\\x{code:02x}").chars().collect()
    } else {
        format!("\\u{{{code:04x}}}").chars().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_long_runs_cut() {
        let s = "blk.0\u{1b}]0;owned\u{7}\nx\u{202e}y \u{9b}z";
        let e = escape(s);
        assert_eq!(e, "blk.0\\x1b]0;owned\\x07\\x0ax\\u{202e}y \\x9bz");
        assert!(e.chars().all(|c| !hidden(c)));
        let long = format!("t.{}", "a".repeat(4000));
        let e = escape(&format!("tensor {long}: bad"));
        assert!(
            e.starts_with("tensor t.aaa") && e.ends_with("...[4003 bytes] bad"),
            "{e}"
        );
        assert!(e.len() < 200);
        assert_eq!(escape("plain words stay"), "plain words stay");
    }

    #[test]
    fn the_writer_escapes_each_line_and_keeps_newlines() {
        use std::io::Write;
        let mut buf = Vec::new();
        {
            let mut w = Escaping::new(&mut buf);
            write!(w, "a\u{1b}[2J b\nsecond").unwrap();
            writeln!(w, " line\u{7}").unwrap();
            write!(w, "tail").unwrap();
        }
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "a\\x1b[2J b\nsecond line\\x07\ntail"
        );
    }
}
