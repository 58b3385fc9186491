//! What the controllers share: the `Context` each is built from (`context`: the API client,
//! the fenced driver, the stores, the journal, events, call limits and `Settings`) and the
//! actions more than one of them takes through it (`actions`: secret read, claim finalizer,
//! CreateVolume and DeleteVolume under the call limits).
//!
//! Not part of `runtime`: the `Context` holds the cluster views' caches and the capacity
//! controller's refresh handle and settings, and those are built on `runtime`, so it sits one
//! layer above all three.

pub(super) mod actions;
pub(super) mod context;
