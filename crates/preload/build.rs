//! Compiles `c/execl.c`: `execl`, `execle` and `execlp` are variadic, which stable Rust
//! cannot define.
fn main() {
    println!("cargo:rerun-if-changed=c/execl.c");
    cc::Build::new()
        .file("c/execl.c")
        .flag_if_supported("-std=c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("cairn_execl");
}
