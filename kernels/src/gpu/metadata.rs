//! Resources of each kernel in an AMD code object, from its `NT_AMDGPU_METADATA` note
//! (MessagePack, code object v3 and later): registers, LDS, scratch and spills, exactly as the
//! compiler allocated them. The `object` crate finds the note and `rmpv` decodes it.

use object::elf::FileHeader64;
use object::read::elf::{FileHeader, SectionHeader};
use object::Endianness;
use rmpv::Value;
use serde::{Deserialize, Serialize};

/// `NT_AMDGPU_METADATA`: the note type of the MessagePack metadata.
const NT_AMDGPU_METADATA: u32 = 32;

/// One kernel's resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    pub name: String,
    /// Vector registers per lane; on gfx90a and gfx94x the unified count of architectural and
    /// accumulation registers, the one occupancy depends on.
    pub vgpr: u32,
    pub agpr: u32,
    pub sgpr: u32,
    /// LDS bytes per workgroup.
    pub lds: u32,
    /// Scratch (private) bytes per lane: spills and stack.
    pub scratch: u32,
    pub vgpr_spill: u32,
    pub sgpr_spill: u32,
    pub wave_size: u32,
    pub max_threads: u32,
}

/// Reads every kernel's resources from a code object.
pub fn read(code_object: &[u8]) -> Result<Vec<KernelResources>, String> {
    let header = FileHeader64::<Endianness>::parse(code_object)
        .map_err(|e| format!("not an ELF code object: {e}"))?;
    let endian = header
        .endian()
        .map_err(|e| format!("not an ELF code object: {e}"))?;
    let sections = header
        .sections(endian, code_object)
        .map_err(|e| format!("unreadable section table: {e}"))?;
    for section in sections.iter() {
        let Some(mut notes) = section
            .notes(endian, code_object)
            .map_err(|e| format!("unreadable note section: {e}"))?
        else {
            continue;
        };
        while let Some(note) = notes.next().map_err(|e| format!("unreadable note: {e}"))? {
            if note.name() == b"AMDGPU" && note.n_type(endian) == NT_AMDGPU_METADATA {
                return parse(note.desc());
            }
        }
    }
    Err("the code object has no AMDGPU metadata note".into())
}

fn parse(mut msgpack: &[u8]) -> Result<Vec<KernelResources>, String> {
    let root =
        rmpv::decode::read_value(&mut msgpack).map_err(|e| format!("malformed metadata: {e}"))?;
    let kernels = field(&root, "amdhsa.kernels")
        .and_then(Value::as_array)
        .ok_or("the metadata lists no kernels")?;
    kernels
        .iter()
        .map(|k| {
            let num = |key: &str| -> Result<u32, String> {
                match field(k, key) {
                    None => Ok(0),
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| format!("metadata field {key} is not a count: {v}")),
                }
            };
            Ok(KernelResources {
                name: field(k, ".name")
                    .and_then(Value::as_str)
                    .ok_or("a kernel without a name")?
                    .to_string(),
                vgpr: num(".vgpr_count")?,
                agpr: num(".agpr_count")?,
                sgpr: num(".sgpr_count")?,
                lds: num(".group_segment_fixed_size")?,
                scratch: num(".private_segment_fixed_size")?,
                vgpr_spill: num(".vgpr_spill_count")?,
                sgpr_spill: num(".sgpr_spill_count")?,
                wave_size: num(".wavefront_size")?,
                max_threads: num(".max_flat_workgroup_size")?,
            })
        })
        .collect()
}

fn field<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}
