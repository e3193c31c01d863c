//! Exact bytes over JSON: how the bridge describes every payload it moves.
//!
//! A payload is text only when it is valid UTF-8 without NUL bytes;
//! otherwise it is base64. Either way it carries its length and sha256, so a
//! client can prove that what arrived is what was sent.

use base64::Engine as _;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// One payload (stdout, stderr, a file's bytes) as the bridge reports it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Payload {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// Length of the bytes carried here.
    pub bytes: u64,
    /// sha256 of the bytes carried here, lowercase hex.
    pub sha256: String,
    pub has_nul: bool,
    /// More bytes were produced than the cap allowed; `total_bytes` says how many.
    pub truncated: bool,
    pub total_bytes: u64,
}

impl Payload {
    /// Describes `data`, of which `total` bytes were produced in all.
    pub fn new(data: &[u8], total: u64) -> Payload {
        let has_nul = data.contains(&0);
        let text = match std::str::from_utf8(data) {
            Ok(s) if !has_nul => Some(s.to_owned()),
            _ => None,
        };
        Payload {
            base64: text.is_none().then(|| base64_encode(data)),
            text,
            bytes: data.len() as u64,
            sha256: sha256_hex(data),
            has_nul,
            truncated: total > data.len() as u64,
            total_bytes: total,
        }
    }
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// Standard base64 with padding (SIMD: a read_file answer encodes up to 64 MiB).
pub fn base64_encode(data: &[u8]) -> String {
    base64_simd::STANDARD.encode_to_string(data)
}

/// Decodes standard base64 (padding optional, whitespace not allowed). The
/// SIMD decoder does the work; the scalar one only explains a rejection.
pub fn base64_decode(s: &str) -> Result<Vec<u8>, String> {
    let simd = if s.ends_with('=') {
        base64_simd::STANDARD
    } else {
        base64_simd::STANDARD_NO_PAD
    };
    if let Ok(data) = simd.decode_to_vec(s) {
        return Ok(data);
    }
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    lenient.decode(s).map_err(|e| match e {
        base64::DecodeError::InvalidByte(offset, byte) => {
            format!("invalid base64: byte {byte:#04x} at offset {offset}")
        }
        e => format!("invalid base64: {e}"),
    })
}

/// A NUL inside a string that becomes a C string (path, argv, env) would
/// silently cut it short: refuse it, naming where.
pub fn check_no_nul(argument: &str, value: &[u8]) -> Result<(), String> {
    match value.iter().position(|&b| b == 0) {
        Some(offset) => Err(format!(
            "`{argument}` contains a NUL byte at offset {offset}; the kernel would cut it short there"
        )),
        None => Ok(()),
    }
}

/// The MIME type of a payload, from its magic bytes (then its name).
pub fn sniff_mime(data: &[u8], name: &str) -> &'static str {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
        (b"\x7fELF", "application/x-executable"),
    ];
    if let Some((_, mime)) = MAGIC.iter().find(|(m, _)| data.starts_with(m)) {
        return mime;
    }
    if data.len() >= 12 && &data[..4] == b"RIFF" && &data[8..12] == b"WEBP" {
        return "image/webp";
    }
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("json") => "application/json",
        Some("csv") => "text/csv",
        Some("html" | "htm") => "text/html",
        Some("svg") => "image/svg+xml",
        _ if std::str::from_utf8(data).is_ok() && !data.contains(&0) => "text/plain",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_only_when_utf8_without_nul() {
        let p = Payload::new(b"hello\n", 6);
        assert_eq!(p.text.as_deref(), Some("hello\n"));
        assert!(p.base64.is_none() && !p.truncated && !p.has_nul);
        let p = Payload::new(b"a\0b", 3);
        assert!(p.text.is_none() && p.has_nul);
        assert_eq!(
            base64_decode(p.base64.as_deref().unwrap()).unwrap(),
            b"a\0b"
        );
        let p = Payload::new(b"\xff\xfe", 10);
        assert!(p.text.is_none() && p.truncated && !p.has_nul);
        assert_eq!(p.total_bytes, 10);
        assert_eq!(
            Payload::new(b"", 0).sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn nul_is_named_with_its_offset() {
        let e = check_no_nul("argv[1]", b"ab\0c").unwrap_err();
        assert!(e.contains("`argv[1]`") && e.contains("offset 2"), "{e}");
        assert!(check_no_nul("path", b"/tmp/x").is_ok());
    }

    #[test]
    fn simd_base64_agrees_with_the_reference_with_or_without_padding() {
        use base64::Engine as _;
        let reference = base64::engine::general_purpose::STANDARD;
        for len in [0usize, 1, 2, 3, 4, 5, 63, 64, 65, 1000, 100_003] {
            let data: Vec<u8> = (0..len).map(|i| (i * 131 + i / 7) as u8).collect();
            let encoded = base64_encode(&data);
            assert_eq!(encoded, reference.encode(&data), "len {len}");
            assert_eq!(base64_decode(&encoded).unwrap(), data, "len {len}");
            let unpadded = encoded.trim_end_matches('=');
            assert_eq!(base64_decode(unpadded).unwrap(), data, "len {len} unpadded");
        }
        assert!(base64_decode("QQ==\n").is_err());
        assert!(base64_decode("Q").is_err());
    }

    #[test]
    fn base64_errors_say_where() {
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        let e = base64_decode("aG*k").unwrap_err();
        assert!(e.contains("offset 2"), "{e}");
    }

    #[test]
    fn mime_from_magic_then_name() {
        assert_eq!(sniff_mime(b"\x89PNG\r\n\x1a\n....", "x.bin"), "image/png");
        assert_eq!(sniff_mime(b"a,b\n", "t.csv"), "text/csv");
        assert_eq!(sniff_mime(b"\xff\x00", "x"), "application/octet-stream");
        assert_eq!(sniff_mime(b"plain", "x"), "text/plain");
    }
}
