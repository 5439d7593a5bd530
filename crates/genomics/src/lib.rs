//! Genomics data in a SpaceJMP address space (docs/SPACEJMP.md, "Genomics data in an
//! address space").
//!
//! * [`gen`]: a deterministic generator of synthetic paired-end sequencing data, as SAM
//!   text and BAM.
//! * [`model`]: the record model the operations see ([`model::Rec`]): the fixed fields of
//!   an alignment, its name and its reference end.
//! * [`ops`]: the operations, written once over any [`ops::Source`] of records: flagstat,
//!   sort by name and by coordinate, index, region query.
//! * [`bamfile`]: the operations on records decoded from BAM files each time (a tool
//!   chain passing files), with `noodles`.
//! * [`dataset`]: a data set loaded once into a segment, in a pointer-rich form with
//!   named roots for the header, the reads and the index; the same operations on it.

pub mod bamfile;
pub mod dataset;
pub mod gen;
pub mod model;
pub mod ops;

pub use cairn_area::fs_err;
