//! The one librados call made here rather than through the `ceph` crate's safe API:
//! its `Rados::config_set` refuses every handle that is not null (it tests the wrong
//! condition), so no option of a live handle can be set through it. librados itself
//! takes options on a connected handle (`rados_osd_op_timeout` applies to the
//! operations that follow).
#![allow(unsafe_code)]

use cairn_area::fs_err;
use std::ffi::CString;
use std::io;

/// Set librados option `name` to `value` on the (connected) cluster handle `rados`.
pub(crate) fn conf_set(rados: &ceph::ceph::Rados, name: &str, value: &str) -> io::Result<()> {
    let (n, v) = (CString::new(name)?, CString::new(value)?);
    // SAFETY: `*rados.inner()` is the live handle `rados` owns (it shuts it down only
    // when dropped, after this borrow); `n` and `v` are NUL-terminated and outlive the
    // call, which copies them; librados serialises option changes itself.
    let r = unsafe { ceph::rados::rados_conf_set(*rados.inner(), n.as_ptr(), v.as_ptr()) };
    if r < 0 {
        return Err(fs_err(
            -r,
            format!("setting librados' option {name} to {value}"),
        ));
    }
    Ok(())
}
