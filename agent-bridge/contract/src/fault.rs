//! Interface fault injection: the bridge's encoding layer corrupts bytes the
//! way the seed's bugs did, so a campaign can prove it places such failures
//! in the `interface` layer. Off unless `--interface-fault` is given, and
//! then announced in the server info and in every result.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterfaceFault {
    /// Bytes pass through a lossy UTF-8 decode: invalid sequences become U+FFFD
    /// (the seed's corrupted image).
    LossyUtf8,
    /// Payloads are cut at their first NUL byte (C-string handling).
    NulTruncate,
    /// "\n" becomes "\r\n" (a text-mode transport).
    Crlf,
    /// Trailing whitespace and newlines are trimmed.
    Trim,
    /// Payloads over 64 KiB are silently cut to 64 KiB, without `truncated`.
    DropTail,
}

impl InterfaceFault {
    pub fn name(self) -> &'static str {
        match self {
            InterfaceFault::LossyUtf8 => "lossy-utf8",
            InterfaceFault::NulTruncate => "nul-truncate",
            InterfaceFault::Crlf => "crlf",
            InterfaceFault::Trim => "trim",
            InterfaceFault::DropTail => "drop-tail",
        }
    }

    /// Corrupts one payload, in either direction.
    pub fn corrupt(self, data: Vec<u8>) -> Vec<u8> {
        match self {
            InterfaceFault::LossyUtf8 => String::from_utf8_lossy(&data).into_owned().into_bytes(),
            InterfaceFault::NulTruncate => match data.iter().position(|&b| b == 0) {
                Some(i) => data[..i].to_vec(),
                None => data,
            },
            InterfaceFault::Crlf => {
                let mut out = Vec::with_capacity(data.len());
                for &b in &data {
                    if b == b'\n' {
                        out.push(b'\r');
                    }
                    out.push(b);
                }
                out
            }
            InterfaceFault::Trim => {
                let end = data
                    .iter()
                    .rposition(|b| !b.is_ascii_whitespace())
                    .map_or(0, |i| i + 1);
                data[..end].to_vec()
            }
            InterfaceFault::DropTail => {
                let mut data = data;
                data.truncate(64 * 1024);
                data
            }
        }
    }
}

/// Applies the fault, if any.
pub fn corrupt(fault: Option<InterfaceFault>, data: Vec<u8>) -> Vec<u8> {
    match fault {
        Some(f) => f.corrupt(data),
        None => data,
    }
}

#[cfg(test)]
mod tests {
    use super::InterfaceFault::*;

    #[test]
    fn each_fault_changes_what_it_should() {
        assert_eq!(
            LossyUtf8.corrupt(b"a\xffb".to_vec()),
            "a\u{fffd}b".as_bytes()
        );
        assert_eq!(LossyUtf8.corrupt(b"plain".to_vec()), b"plain");
        assert_eq!(NulTruncate.corrupt(b"ab\0cd".to_vec()), b"ab");
        assert_eq!(Crlf.corrupt(b"a\nb\n".to_vec()), b"a\r\nb\r\n");
        assert_eq!(Trim.corrupt(b"x \n\n".to_vec()), b"x");
        assert_eq!(DropTail.corrupt(vec![7; 100_000]).len(), 65_536);
        assert_eq!(DropTail.corrupt(vec![7; 10]).len(), 10);
    }
}
