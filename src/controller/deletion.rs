//! From a released PV to a deleted backend volume: the volume controller (`volumes`: the PV
//! finalizer, the attachment check, DeleteVolume, the PV delete).

pub(super) mod volumes;
