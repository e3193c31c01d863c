//! ELF headers read by hand (never by running ldd or the program): the
//! machine a binary is built for, its interpreter, and the shared
//! libraries the loader would fail to find.
//!
//! Only the header, the program headers, the dynamic segment and the
//! strings it names are read, so a 200 MB browser costs a few reads.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

const PT_LOAD: u64 = 1;
const PT_DYNAMIC: u64 = 2;
const PT_INTERP: u64 = 3;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_RPATH: u64 = 15;
const DT_RUNPATH: u64 = 29;

/// Libraries followed per binary (a browser needs ~150).
const MAX_OBJECTS: usize = 512;

/// What the loader needs to know about one ELF file.
#[derive(Debug, Clone, PartialEq)]
pub struct Elf {
    pub machine: String,
    pub class64: bool,
    pub interp: Option<String>,
    pub needed: Vec<String>,
    pub rpath: Vec<String>,
    pub runpath: Vec<String>,
}

/// The ELF at `path`, `Ok(None)` when the file is not ELF.
pub fn read(path: &Path) -> io::Result<Option<Elf>> {
    let file = File::open(path)?;
    let mut head = [0u8; 64];
    let n = read_upto(&file, &mut head, 0)?;
    if n < 52 || head[..4] != *b"\x7fELF" {
        return Ok(None);
    }
    let class64 = match head[4] {
        1 => false,
        2 => true,
        _ => return Ok(None),
    };
    let little = match head[5] {
        1 => true,
        2 => false,
        _ => return Ok(None),
    };
    if class64 && n < 64 {
        return Ok(None);
    }
    let r = Reader { file, little };
    let machine = machine_name(r.int(&head[18..20]) as u16, class64, little);
    let (phoff, phentsize, phnum) = if class64 {
        (
            r.int(&head[32..40]),
            r.int(&head[54..56]),
            r.int(&head[56..58]),
        )
    } else {
        (
            r.int(&head[28..32]),
            r.int(&head[42..44]),
            r.int(&head[44..46]),
        )
    };
    let min_entsize = if class64 { 56 } else { 32 };
    if phnum > 1024 || (phnum > 0 && phentsize < min_entsize) {
        return Err(bad("implausible program header table"));
    }
    let table = r.bytes(phoff, (phnum * phentsize) as usize)?;
    let mut loads = Vec::new();
    let (mut dynamic, mut interp) = (None, None);
    // no table (a relocatable object): an empty loop, not a chunk size of 0
    for ph in table.chunks_exact((phentsize as usize).max(1)) {
        let p_type = r.int(&ph[0..4]);
        // (offset, vaddr, filesz)
        let seg = if class64 {
            (r.int(&ph[8..16]), r.int(&ph[16..24]), r.int(&ph[32..40]))
        } else {
            (r.int(&ph[4..8]), r.int(&ph[8..12]), r.int(&ph[16..20]))
        };
        match p_type {
            PT_LOAD => loads.push(seg),
            PT_DYNAMIC => dynamic = Some(seg),
            PT_INTERP => interp = Some(seg),
            _ => {}
        }
    }
    let interp = match interp {
        Some((off, _, size)) => Some(r.cstr(off, size.min(4096) as usize)?),
        None => None,
    };
    let mut elf = Elf {
        machine,
        class64,
        interp,
        needed: Vec::new(),
        rpath: Vec::new(),
        runpath: Vec::new(),
    };
    let Some((dyn_off, _, dyn_size)) = dynamic else {
        return Ok(Some(elf)); // static: nothing to load
    };
    let entry = if class64 { 16 } else { 8 };
    let table = r.bytes(dyn_off, dyn_size.min(64 * 1024) as usize)?;
    let mut strtab = None;
    let mut wanted = Vec::new();
    for d in table.chunks_exact(entry) {
        let half = entry / 2;
        let (tag, val) = (r.int(&d[..half]), r.int(&d[half..]));
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_NEEDED | DT_RPATH | DT_RUNPATH => wanted.push((tag, val)),
            _ => {}
        }
    }
    if wanted.is_empty() {
        return Ok(Some(elf));
    }
    let strtab = strtab.ok_or_else(|| bad("dynamic section without DT_STRTAB"))?;
    // the string table is named by address: find the file offset that
    // the loaded segment holding it maps there
    let base = loads
        .iter()
        .find(|(_, vaddr, size)| strtab >= *vaddr && strtab - vaddr < *size)
        .map(|(off, vaddr, _)| off.saturating_add(strtab - vaddr))
        .ok_or_else(|| bad("DT_STRTAB outside the loaded segments"))?;
    for (tag, val) in wanted {
        let s = r.cstr(base.saturating_add(val), 4096)?;
        match tag {
            DT_NEEDED => elf.needed.push(s),
            DT_RPATH => elf.rpath.extend(s.split(':').map(String::from)),
            _ => elf.runpath.extend(s.split(':').map(String::from)),
        }
    }
    Ok(Some(elf))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("not a valid ELF: {what}"),
    )
}

/// Reads as much of `buf` as the file has at `off`.
fn read_upto(file: &File, buf: &mut [u8], off: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], off + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

struct Reader {
    file: File,
    little: bool,
}

impl Reader {
    /// An unsigned integer of 2, 4 or 8 bytes in the file's byte order.
    fn int(&self, b: &[u8]) -> u64 {
        let mut v = 0u64;
        if self.little {
            for &x in b.iter().rev() {
                v = (v << 8) | x as u64;
            }
        } else {
            for &x in b {
                v = (v << 8) | x as u64;
            }
        }
        v
    }

    fn bytes(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        if read_upto(&self.file, &mut buf, off)? < len {
            return Err(bad("truncated"));
        }
        Ok(buf)
    }

    /// A NUL-terminated string of at most `max` bytes at `off`.
    fn cstr(&self, off: u64, max: usize) -> io::Result<String> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < max {
            let n = read_upto(&self.file, &mut chunk, off.saturating_add(out.len() as u64))?;
            if n == 0 {
                break;
            }
            match chunk[..n].iter().position(|b| *b == 0) {
                Some(end) => {
                    out.extend_from_slice(&chunk[..end]);
                    break;
                }
                None => out.extend_from_slice(&chunk[..n]),
            }
        }
        out.truncate(max);
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

/// `uname -m`'s name for an ELF e_machine.
pub fn machine_name(e_machine: u16, class64: bool, little: bool) -> String {
    match (e_machine, class64, little) {
        (62, _, _) => "x86_64",
        (3, _, _) => "i386",
        (183, _, _) => "aarch64",
        (40, _, _) => "arm",
        (243, true, _) => "riscv64",
        (243, false, _) => "riscv32",
        (21, _, true) => "ppc64le",
        (21, _, false) => "ppc64",
        (20, _, _) => "ppc",
        (22, _, _) => "s390x",
        (258, _, _) => "loongarch64",
        (8, true, _) => "mips64",
        (8, false, _) => "mips",
        (2, _, _) | (43, _, _) => "sparc64",
        (n, _, _) => return format!("e_machine {n}"),
    }
    .into()
}

/// Debian's multiarch directory name for a machine.
fn triplet(machine: &str) -> Option<&'static str> {
    Some(match machine {
        "x86_64" => "x86_64-linux-gnu",
        "i386" => "i386-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        "riscv64" => "riscv64-linux-gnu",
        "ppc64le" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        "loongarch64" => "loongarch64-linux-gnu",
        _ => return None,
    })
}

/// What one command's file is, as far as running it goes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Inspected {
    /// The ELF machine; `None` for scripts and other files.
    pub machine: Option<String>,
    /// Libraries (and a missing interpreter, by path) the loader would
    /// not find.
    pub missing: Vec<String>,
    pub script: bool,
}

/// Where the dynamic loader would look for a library: each object's own
/// RPATH/RUNPATH, $LD_LIBRARY_PATH, /etc/ld.so.conf's directories, the
/// multiarch and default directories. /etc/ld.so.cache is not read: its
/// directories are the ld.so.conf ones.
pub struct LibSearch {
    ld_library_path: Vec<PathBuf>,
    conf_dirs: Vec<PathBuf>,
    defaults: Vec<PathBuf>,
    parsed: HashMap<PathBuf, Option<Rc<Elf>>>,
    found: HashMap<(String, String), Option<PathBuf>>,
}

impl LibSearch {
    /// The search this process's loader would do.
    pub fn from_system() -> LibSearch {
        let ld_library_path = std::env::var_os("LD_LIBRARY_PATH")
            .unwrap_or_default()
            .to_string_lossy()
            .split([':', ';'])
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        let defaults = ["/lib", "/usr/lib", "/lib64", "/usr/lib64"]
            .iter()
            .map(PathBuf::from)
            .collect();
        LibSearch::with_dirs(
            ld_library_path,
            ld_so_conf(Path::new("/etc/ld.so.conf")),
            defaults,
        )
    }

    /// A search through exactly these directories (and the multiarch ones
    /// under the defaults).
    pub fn with_dirs(
        ld_library_path: Vec<PathBuf>,
        conf_dirs: Vec<PathBuf>,
        defaults: Vec<PathBuf>,
    ) -> LibSearch {
        LibSearch {
            ld_library_path,
            conf_dirs,
            defaults,
            parsed: HashMap::new(),
            found: HashMap::new(),
        }
    }

    /// The machine of the file at `path` and what it would miss at load
    /// time; an error only when the file cannot be read at all.
    pub fn inspect(&mut self, path: &Path) -> Result<Inspected, String> {
        let mut head = [0u8; 2];
        let file = File::open(path).map_err(|e| super::util::why(path, &e))?;
        let n = read_upto(&file, &mut head, 0).map_err(|e| super::util::why(path, &e))?;
        if n == 2 && head == *b"#!" {
            return Ok(Inspected {
                script: true,
                ..Inspected::default()
            });
        }
        let elf = match read(path) {
            Ok(Some(elf)) => elf,
            Ok(None) => return Ok(Inspected::default()),
            Err(e) => return Err(super::util::why(path, &e)),
        };
        let missing = self.missing(path, &elf);
        Ok(Inspected {
            machine: Some(elf.machine.clone()),
            missing,
            script: false,
        })
    }

    /// The libraries `elf` (at `path`) and what they need in turn would
    /// not find, and its interpreter when that is missing.
    pub fn missing(&mut self, path: &Path, elf: &Elf) -> Vec<String> {
        let mut missing = Vec::new();
        if let Some(interp) = &elf.interp
            && !Path::new(interp).exists()
        {
            missing.push(interp.clone());
        }
        let exe_origin = origin(path);
        // the executable's RPATH also serves its libraries (when it has no RUNPATH)
        let exe_rpath: Vec<PathBuf> = if elf.runpath.is_empty() {
            expand(&elf.rpath, &exe_origin, elf)
        } else {
            Vec::new()
        };
        let mut seen: HashSet<PathBuf> = HashSet::new();
        let mut queue = VecDeque::from([(path.to_path_buf(), Rc::new(elf.clone()))]);
        while let Some((obj_path, obj)) = queue.pop_front() {
            if seen.len() >= MAX_OBJECTS {
                break;
            }
            let obj_origin = origin(&obj_path);
            let mut own: Vec<PathBuf> = Vec::new();
            if obj.runpath.is_empty() {
                own.extend(expand(&obj.rpath, &obj_origin, &obj));
                own.extend(exe_rpath.iter().cloned());
            }
            let runpath = expand(&obj.runpath, &obj_origin, &obj);
            for name in &obj.needed {
                let hit = if name.contains('/') {
                    let p = PathBuf::from(name);
                    p.exists().then_some(p)
                } else {
                    own.iter()
                        .find_map(|d| self.usable(&d.join(name), &obj))
                        .or_else(|| self.in_system(name, &obj, &runpath))
                };
                match hit {
                    None => {
                        if !missing.contains(name) {
                            missing.push(name.clone());
                        }
                    }
                    Some(lib) => {
                        let key = std::fs::canonicalize(&lib).unwrap_or(lib.clone());
                        if seen.insert(key)
                            && let Some(Some(next)) = self.parsed.get(&lib).cloned()
                        {
                            queue.push_back((lib, next));
                        }
                    }
                }
            }
        }
        missing
    }

    /// `name` through $LD_LIBRARY_PATH, the object's RUNPATH and the
    /// system directories (remembered per machine when RUNPATH is empty).
    fn in_system(&mut self, name: &str, obj: &Elf, runpath: &[PathBuf]) -> Option<PathBuf> {
        let key = (obj.machine.clone(), name.to_string());
        if runpath.is_empty()
            && let Some(hit) = self.found.get(&key)
        {
            return hit.clone();
        }
        let mut dirs: Vec<PathBuf> = self.ld_library_path.clone();
        dirs.extend(runpath.iter().cloned());
        dirs.extend(self.conf_dirs.iter().cloned());
        if let Some(t) = triplet(&obj.machine) {
            for d in self.defaults.clone() {
                if !d.ends_with("lib64") {
                    dirs.push(d.join(t));
                }
            }
        }
        dirs.extend(self.defaults.iter().cloned());
        let hit = dirs.iter().find_map(|d| self.usable(&d.join(name), obj));
        if runpath.is_empty() {
            self.found.insert(key, hit.clone());
        }
        hit
    }

    /// `candidate` when it exists and is usable by `obj` (an ELF of the
    /// same machine and class; an unreadable one is given the benefit of
    /// the doubt). Parsed ones are remembered.
    fn usable(&mut self, candidate: &Path, obj: &Elf) -> Option<PathBuf> {
        if !self.parsed.contains_key(candidate) {
            if !candidate.is_file() {
                return None;
            }
            let parsed = read(candidate).ok().flatten().map(Rc::new);
            self.parsed.insert(candidate.to_path_buf(), parsed);
        }
        match &self.parsed[candidate] {
            Some(lib) if lib.machine != obj.machine || lib.class64 != obj.class64 => None,
            _ => Some(candidate.to_path_buf()),
        }
    }
}

/// The directory of the object's real file, for $ORIGIN.
fn origin(path: &Path) -> PathBuf {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    real.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// RPATH/RUNPATH entries with $ORIGIN, $LIB and $PLATFORM expanded.
fn expand(entries: &[String], origin: &Path, elf: &Elf) -> Vec<PathBuf> {
    let o = origin.display().to_string();
    let libs: Vec<String> = match triplet(&elf.machine) {
        Some(t) => vec![format!("lib/{t}"), "lib64".into(), "lib".into()],
        None => vec!["lib64".into(), "lib".into()],
    };
    let mut out = Vec::new();
    for e in entries.iter().filter(|e| !e.is_empty()) {
        let e = e
            .replace("${ORIGIN}", &o)
            .replace("$ORIGIN", &o)
            .replace("${PLATFORM}", &elf.machine)
            .replace("$PLATFORM", &elf.machine);
        if e.contains("$LIB") || e.contains("${LIB}") {
            for l in &libs {
                out.push(PathBuf::from(e.replace("${LIB}", l).replace("$LIB", l)));
            }
        } else {
            out.push(PathBuf::from(e));
        }
    }
    out
}

/// The directories /etc/ld.so.conf lists, following its `include` lines
/// one level deep (as Debian's /etc/ld.so.conf.d/*.conf).
pub fn ld_so_conf(path: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    conf_lines(path, 1, &mut dirs);
    dirs
}

fn conf_lines(path: &Path, depth: u32, dirs: &mut Vec<PathBuf>) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(pattern) = line.strip_prefix("include") {
            if depth == 0 {
                continue;
            }
            let pattern = pattern.trim();
            let pattern = if pattern.starts_with('/') {
                PathBuf::from(pattern)
            } else {
                path.parent().unwrap_or(Path::new("/")).join(pattern)
            };
            for file in glob_last(&pattern) {
                conf_lines(&file, depth - 1, dirs);
            }
        } else if line.starts_with('/') {
            // `dir` or the old `dir=type`
            let dir = PathBuf::from(line.split('=').next().unwrap_or(line).trim());
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
}

/// Files matching a pattern with `*` in its last component only, sorted.
fn glob_last(pattern: &Path) -> Vec<PathBuf> {
    let name = pattern
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let Some(dir) = pattern.parent() else {
        return Vec::new();
    };
    let Some((pre, post)) = name.split_once('*') else {
        return vec![pattern.to_path_buf()];
    };
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A minimal 64-bit little-endian x86_64 ELF: one PT_LOAD over the
    /// whole file, a PT_DYNAMIC with DT_NEEDED entries and a RUNPATH.
    pub fn fake_elf(needed: &[&str], runpath: Option<&str>) -> Vec<u8> {
        let vaddr = 0x40_0000u64;
        let mut strtab = vec![0u8];
        let mut offsets = Vec::new();
        for s in needed.iter().copied().chain(runpath) {
            offsets.push(strtab.len() as u64);
            strtab.extend_from_slice(s.as_bytes());
            strtab.push(0);
        }
        let n_dyn = needed.len() + usize::from(runpath.is_some()) + 2;
        let dyn_off = 64 + 2 * 56;
        let str_off = dyn_off + n_dyn * 16;
        let total = (str_off + strtab.len()) as u64;
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2; // 64-bit
        f[5] = 1; // little-endian
        f[6] = 1;
        f[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
        f[18..20].copy_from_slice(&62u16.to_le_bytes()); // x86_64
        f[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
        f[52..54].copy_from_slice(&64u16.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&2u16.to_le_bytes());
        let ph = |t: u32, off: u64, size: u64| {
            let mut p = vec![0u8; 56];
            p[0..4].copy_from_slice(&t.to_le_bytes());
            p[8..16].copy_from_slice(&off.to_le_bytes());
            p[16..24].copy_from_slice(&(vaddr + off).to_le_bytes());
            p[32..40].copy_from_slice(&size.to_le_bytes());
            p[40..48].copy_from_slice(&size.to_le_bytes());
            p
        };
        f.extend(ph(1, 0, total));
        f.extend(ph(2, dyn_off as u64, (n_dyn * 16) as u64));
        let mut d = |tag: u64, val: u64| {
            f.extend_from_slice(&tag.to_le_bytes());
            f.extend_from_slice(&val.to_le_bytes());
        };
        for off in &offsets[..needed.len()] {
            d(DT_NEEDED, *off);
        }
        if runpath.is_some() {
            d(DT_RUNPATH, offsets[needed.len()]);
        }
        d(DT_STRTAB, vaddr + str_off as u64);
        d(DT_NULL, 0);
        f.extend(strtab);
        f
    }

    #[test]
    fn ls_needs_libc() {
        let ls = Path::new("/bin/ls");
        let elf = read(ls).unwrap().expect("/bin/ls is ELF");
        assert!(
            elf.needed.iter().any(|n| n.starts_with("libc.so")),
            "{elf:?}"
        );
        assert_eq!(elf.machine, std::env::consts::ARCH, "{elf:?}");
        assert!(elf.interp.is_some(), "{elf:?}");
        // all found on this machine
        let mut search = LibSearch::from_system();
        assert_eq!(search.missing(ls, &elf), Vec::<String>::new());
        assert_eq!(read(Path::new("/etc/passwd")).unwrap(), None);
    }

    #[test]
    fn a_fake_elf_reads_back() {
        let bytes = fake_elf(&["libone.so.1", "libtwo.so.2"], Some("$ORIGIN/../lib"));
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tool");
        std::fs::write(&p, bytes).unwrap();
        let elf = read(&p).unwrap().unwrap();
        assert_eq!(elf.machine, "x86_64");
        assert_eq!(elf.needed, ["libone.so.1", "libtwo.so.2"]);
        assert_eq!(elf.runpath, ["$ORIGIN/../lib"]);
        assert_eq!(elf.interp, None);
    }

    #[test]
    fn missing_libraries_against_a_temp_dir() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        let lib = dir.path().join("lib");
        let sys = dir.path().join("sys");
        for d in [&bin, &lib, &sys] {
            std::fs::create_dir(d).unwrap();
        }
        let tool = bin.join("tool");
        std::fs::write(
            &tool,
            fake_elf(
                &["libone.so.1", "libtwo.so.2", "libthree.so.3"],
                Some("$ORIGIN/../lib"),
            ),
        )
        .unwrap();
        // libone: through $ORIGIN; libtwo: in a system dir, needing a
        // libfour nobody has; libthree: nowhere
        std::fs::write(lib.join("libone.so.1"), fake_elf(&[], None)).unwrap();
        std::fs::write(sys.join("libtwo.so.2"), fake_elf(&["libfour.so.4"], None)).unwrap();
        let mut search = LibSearch::with_dirs(Vec::new(), vec![sys.clone()], Vec::new());
        let got = search.inspect(&tool).unwrap();
        assert_eq!(got.machine.as_deref(), Some("x86_64"));
        assert_eq!(got.missing, ["libthree.so.3", "libfour.so.4"]);
        // a library of another machine does not count
        let mut arm = fake_elf(&[], None);
        arm[18..20].copy_from_slice(&183u16.to_le_bytes());
        std::fs::write(sys.join("libthree.so.3"), arm).unwrap();
        let mut search = LibSearch::with_dirs(Vec::new(), vec![sys.clone()], Vec::new());
        assert_eq!(
            search.inspect(&tool).unwrap().missing,
            ["libthree.so.3", "libfour.so.4"]
        );
        // /bin/ls with nowhere to look misses what it needs
        let ls = read(Path::new("/bin/ls")).unwrap().unwrap();
        let mut empty = LibSearch::with_dirs(Vec::new(), Vec::new(), Vec::new());
        let missing = empty.missing(Path::new("/bin/ls"), &ls);
        assert_eq!(missing, ls.needed);
        // a script is no ELF
        let script = bin.join("script");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
        assert!(empty.inspect(&script).unwrap().script);
    }

    #[test]
    fn ld_so_conf_follows_includes_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("conf.d")).unwrap();
        std::fs::write(
            d.join("ld.so.conf"),
            "# comment\n/opt/a\ninclude conf.d/*.conf\n",
        )
        .unwrap();
        std::fs::write(
            d.join("conf.d/x.conf"),
            "/opt/b # b\ninclude /nowhere/*.conf\n",
        )
        .unwrap();
        std::fs::write(d.join("conf.d/y.txt"), "/opt/c\n").unwrap();
        assert_eq!(
            ld_so_conf(&d.join("ld.so.conf")),
            [PathBuf::from("/opt/a"), PathBuf::from("/opt/b")]
        );
    }
}
