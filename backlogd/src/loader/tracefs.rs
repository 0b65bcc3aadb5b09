//! Tracepoint record layouts from tracefs, and mounting tracefs where boot did not.

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

const TRACEFS: &str = "/sys/kernel/tracing";
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

#[derive(Debug, thiserror::Error)]
pub enum TracefsError {
    #[error(
        "tracefs is not mounted and mounting it at {TRACEFS} failed ({0}). Fix: \
         `mount -t tracefs nodev {TRACEFS}` (or add it to /etc/fstab) and start backlogd again"
    )]
    Mount(std::io::Error),
    #[error(
        "tracepoint {category}:{name} does not exist on this kernel ({path}). backlogd \
         needs it to follow listen(2); this kernel may lack CONFIG_FTRACE_SYSCALLS"
    )]
    NoTracepoint {
        category: String,
        name: String,
        path: String,
    },
    #[error("tracepoint {category}:{name} has no field `{field}` in {path}")]
    NoField {
        category: String,
        name: String,
        field: String,
        path: String,
    },
}

/// The directory holding `events/`, mounting tracefs if nothing provides it.
pub fn tracing_dir() -> Result<PathBuf, TracefsError> {
    for dir in [TRACEFS, DEBUGFS_TRACING] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(PathBuf::from(dir));
        }
    }
    let target = CString::new(TRACEFS).expect("no NUL");
    let fstype = CString::new("tracefs").expect("no NUL");
    let source = CString::new("nodev").expect("no NUL");
    // SAFETY: all pointers are valid NUL-terminated strings for the call's duration.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TracefsError::Mount(std::io::Error::last_os_error()));
    }
    tracing::info!("mounted tracefs at {TRACEFS}");
    Ok(PathBuf::from(TRACEFS))
}

/// A tracepoint's record format (`events/CATEGORY/NAME/format`).
pub struct Format {
    category: String,
    name: String,
    path: String,
    text: String,
}

impl Format {
    pub fn read(tracing: &Path, category: &str, name: &str) -> Result<Self, TracefsError> {
        let path = tracing
            .join("events")
            .join(category)
            .join(name)
            .join("format");
        let text = std::fs::read_to_string(&path).map_err(|_| TracefsError::NoTracepoint {
            category: category.to_owned(),
            name: name.to_owned(),
            path: path.display().to_string(),
        })?;
        Ok(Self {
            category: category.to_owned(),
            name: name.to_owned(),
            path: path.display().to_string(),
            text,
        })
    }

    /// Offset of `field` in the record.
    pub fn offset(&self, field: &str) -> Result<u32, TracefsError> {
        field_offset(&self.text, field).ok_or_else(|| TracefsError::NoField {
            category: self.category.clone(),
            name: self.name.clone(),
            field: field.to_owned(),
            path: self.path.clone(),
        })
    }
}

/// Parses `field:TYPE NAME[N];\toffset:O;\tsize:S;\tsigned:X;` lines.
fn field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let (decl, rest) = decl.split_once(';')?;
        let ident = decl.rsplit([' ', '*']).next()?;
        let ident = ident.split('[').next()?;
        if ident != field {
            return None;
        }
        rest.split(';')
            .find_map(|kv| kv.trim().strip_prefix("offset:"))?
            .parse()
            .ok()
    })
}

#[cfg(test)]
mod tests {
    use super::field_offset;

    const SET_STATE: &str = "name: inet_sock_set_state
ID: 2287
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:const void * skaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:int oldstate;\toffset:16;\tsize:4;\tsigned:1;
\tfield:__u16 protocol;\toffset:30;\tsize:2;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;
";

    #[test]
    fn parses_pointer_scalar_and_array_fields() {
        assert_eq!(field_offset(SET_STATE, "skaddr"), Some(8));
        assert_eq!(field_offset(SET_STATE, "oldstate"), Some(16));
        assert_eq!(field_offset(SET_STATE, "protocol"), Some(30));
        assert_eq!(field_offset(SET_STATE, "saddr_v6"), Some(40));
    }

    #[test]
    fn prefix_of_a_field_name_does_not_match() {
        assert_eq!(field_offset(SET_STATE, "state"), None);
        assert_eq!(field_offset(SET_STATE, "saddr"), None);
    }
}
