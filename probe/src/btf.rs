//! Member offsets of kernel structs, read from the kernel's own BTF
//! (`/sys/kernel/btf/vmlinux`).
//!
//! The syscall programs read the current thread's ids as plain loads from
//! the task (`bpf_get_current_task_btf`) instead of calling
//! `bpf_get_current_pid_tgid` on every syscall of every thread: ~5 ns less
//! per program hit on this kernel (docs/BENCHMARKS.md). The verifier wants those offsets constant: the loader
//! writes them into the object's read-only data before it loads it. aya's
//! BTF parser keeps its type table private, and this needs one walk over
//! the type section (format: the kernel's Documentation/bpf/btf.rst).

const MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;

/// Byte offset of `member` in the struct named `name`, searching anonymous
/// unions and structs inside it. None when the BTF is unreadable, the
/// struct or member is missing, or the member is a bitfield.
pub fn member_offset(btf: &[u8], name: &str, member: &str) -> Option<u32> {
    let types = Types::parse(btf)?;
    types.find_member(types.struct_named(name)?, member, 0)
}

/// Where `task_struct.pid` and `task_struct.tgid` sit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskIdOffsets {
    pub pid: u32,
    pub tgid: u32,
}

/// The running kernel's [`TaskIdOffsets`], when its programs may read
/// them: only where the kernel has `bpf_get_current_task_btf` (5.11 on;
/// 5.10 refuses the whole program with "invalid func unknown#158").
pub fn task_id_offsets() -> Option<TaskIdOffsets> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").ok()?;
    let types = Types::parse(&btf)?;
    if !types.has_enumerator("bpf_func_id", "BPF_FUNC_get_current_task_btf") {
        return None;
    }
    let task = types.struct_named("task_struct")?;
    Some(TaskIdOffsets {
        pid: types.find_member(task, "pid", 0)?,
        tgid: types.find_member(task, "tgid", 0)?,
    })
}

#[derive(Clone, Copy)]
struct TypeHeader {
    name_off: u32,
    info: u32,
}

impl TypeHeader {
    fn kind(self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(self) -> usize {
        (self.info & 0xffff) as usize
    }
}

/// The type section, indexed: only where each type starts is kept (the
/// kernel's BTF has ~150k types; the probe's peak RSS counts what this holds).
struct Types<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Byte offset of type id i + 1 in `types`.
    at: Vec<u32>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl<'a> Types<'a> {
    fn parse(btf: &'a [u8]) -> Option<Types<'a>> {
        if u16::from_le_bytes(btf.get(0..2)?.try_into().ok()?) != MAGIC {
            return None; // not BTF, or not little-endian
        }
        let hdr_len = u32_at(btf, 4)? as usize;
        let (type_off, type_len) = (u32_at(btf, 8)? as usize, u32_at(btf, 12)? as usize);
        let (str_off, str_len) = (u32_at(btf, 16)? as usize, u32_at(btf, 20)? as usize);
        let section = |off: usize, len: usize| btf.get(hdr_len + off..hdr_len + off + len);
        let (types, strings) = (section(type_off, type_len)?, section(str_off, str_len)?);
        let mut at = Vec::new();
        let mut pos = 0;
        while pos < types.len() {
            at.push(u32::try_from(pos).ok()?);
            let t = TypeHeader {
                name_off: u32_at(types, pos)?,
                info: u32_at(types, pos + 4)?,
            };
            // the bytes that follow each kind's 12-byte header
            pos += 12
                + match t.kind() {
                    1 | 14 | 17 => 4,                                    // int, var, decl_tag
                    3 => 12,                                             // array
                    KIND_STRUCT | KIND_UNION | 15 | 19 => t.vlen() * 12, // members, datasec, enum64
                    6 | 13 => t.vlen() * 8,                              // enum, func_proto
                    2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type_tag
                    _ => return None,          // a kind newer than this parser
                };
        }
        Some(Types { types, strings, at })
    }

    fn header(&self, id: u32) -> Option<TypeHeader> {
        let pos = *self.at.get((id as usize).checked_sub(1)?)? as usize;
        Some(TypeHeader {
            name_off: u32_at(self.types, pos)?,
            info: u32_at(self.types, pos + 4)?,
        })
    }

    /// The id of the first struct called `name`.
    fn struct_named(&self, name: &str) -> Option<u32> {
        (1..=self.at.len() as u32).find(|&id| {
            self.header(id)
                .is_some_and(|t| t.kind() == KIND_STRUCT && self.name(t.name_off) == Some(name))
        })
    }

    /// Whether enum `name` has a value called `value`: the kernel's BTF
    /// lists the helpers it knows in `enum bpf_func_id`, which is how a
    /// helper is probed here without loading a program.
    fn has_enumerator(&self, name: &str, value: &str) -> bool {
        (1..=self.at.len() as u32).any(|id| {
            let Some(t) = self.header(id) else {
                return false;
            };
            if t.kind() != KIND_ENUM || self.name(t.name_off) != Some(name) {
                return false;
            }
            let first = self.at[id as usize - 1] as usize + 12;
            (0..t.vlen()).any(|i| {
                u32_at(self.types, first + i * 8).is_some_and(|off| self.name(off) == Some(value))
            })
        })
    }

    fn name(&self, off: u32) -> Option<&str> {
        let rest = self.strings.get(off as usize..)?;
        let end = rest.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&rest[..end]).ok()
    }

    /// `member`'s byte offset in struct or union `id`, `base` bytes into
    /// the outer struct; descends into anonymous struct and union members.
    fn find_member(&self, id: u32, member: &str, base: u32) -> Option<u32> {
        let t = self.header(id)?;
        let first = *self.at.get(id as usize - 1)? as usize + 12;
        for i in 0..t.vlen() {
            let m = first + i * 12;
            let (name_off, type_id, offset) = (
                u32_at(self.types, m)?,
                u32_at(self.types, m + 4)?,
                u32_at(self.types, m + 8)?,
            );
            // the low 24 bits are the bit offset whether or not the struct's
            // kind_flag packs a bitfield size into the high 8
            let bits = offset & 0x00ff_ffff;
            if self.name(name_off) == Some(member) {
                return (bits % 8 == 0).then_some(base + bits / 8);
            }
            if name_off == 0
                && self
                    .header(type_id)
                    .is_some_and(|inner| matches!(inner.kind(), KIND_STRUCT | KIND_UNION))
                && let Some(off) = self.find_member(type_id, member, base + bits / 8)
            {
                return Some(off);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built BTF blob: struct outer { int a; union { int pid; }; int tgid; }.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0pid\0tgid\0";
        let s = |name: &str| {
            let needle = format!("\0{name}\0");
            (strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .unwrap()
                + 1) as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| words.iter().for_each(|w| types.extend(w.to_le_bytes()));
        push(&[s("int"), 1 << 24, 4, 32]); // 1: int (4 bytes)
        push(&[0, (KIND_UNION << 24) | 1, 4, s("pid"), 1, 0]); // 2: anonymous union
        push(&[s("outer"), (KIND_STRUCT << 24) | 3, 12]); // 3: outer
        push(&[s("a"), 1, 0, 0, 2, 32, s("tgid"), 1, 64]);
        let mut b = Vec::new();
        b.extend(MAGIC.to_le_bytes());
        b.extend([1u8, 0]); // version, flags
        for w in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            b.extend(w.to_le_bytes());
        }
        b.extend(&types);
        b.extend(strings);
        b
    }

    #[test]
    fn members_are_found_directly_and_inside_anonymous_unions() {
        let b = blob();
        assert_eq!(member_offset(&b, "outer", "a"), Some(0));
        assert_eq!(member_offset(&b, "outer", "pid"), Some(4));
        assert_eq!(member_offset(&b, "outer", "tgid"), Some(8));
        assert_eq!(member_offset(&b, "outer", "nope"), None);
        assert_eq!(member_offset(&b, "missing", "a"), None);
    }

    #[test]
    fn garbage_is_not_btf() {
        assert_eq!(
            member_offset(b"not btf at all, not at all", "outer", "a"),
            None
        );
        let mut b = blob();
        b.truncate(40);
        assert_eq!(member_offset(&b, "outer", "a"), None);
    }

    #[test]
    fn this_kernel_lists_its_helpers_in_bpf_func_id() {
        let btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("kernel BTF");
        let types = Types::parse(&btf).unwrap();
        assert!(types.has_enumerator("bpf_func_id", "BPF_FUNC_map_lookup_elem"));
        assert!(types.has_enumerator("bpf_func_id", "BPF_FUNC_get_current_task_btf"));
        assert!(!types.has_enumerator("bpf_func_id", "BPF_FUNC_no_such_helper"));
    }

    #[test]
    fn this_kernels_task_ids_sit_side_by_side() {
        // pid_t pid; pid_t tgid; in every kernel since 2.6
        let TaskIdOffsets { pid, tgid } =
            task_id_offsets().expect("kernel BTF with task_struct.pid and .tgid");
        assert_eq!(tgid, pid + 4);
        assert!(pid > 0 && pid % 4 == 0);
    }
}
