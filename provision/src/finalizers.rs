//! Finalizer edits as patches. Removal is addressed by index and guarded by JSON-patch `test`
//! operations on the object's UID and on that index, not by a resourceVersion: the PV and PVC
//! protection controllers edit a deleting object's finalizers at the same moment we do, and a
//! resourceVersion precondition would turn each of their edits into a failed attempt of ours.

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// The patch removing `finalizer` from the object described by `meta`, or `None` when the
/// object does not carry it. The patch fails (422) if the object was replaced by another of
/// the same name or the finalizer moved; the caller reads the object again and retries.
pub fn finalizer_removal_patch(meta: &ObjectMeta, finalizer: &str) -> Option<Patch> {
    let index = meta
        .finalizers
        .as_deref()?
        .iter()
        .position(|f| f == finalizer)?;
    let at_index = PointerBuf::from_tokens(["metadata", "finalizers", &index.to_string()]);
    let mut operations = Vec::with_capacity(3);
    if let Some(uid) = &meta.uid {
        operations.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: Value::String(uid.clone()),
        }));
    }
    operations.push(PatchOperation::Test(TestOperation {
        path: at_index.clone(),
        value: Value::String(finalizer.to_owned()),
    }));
    operations.push(PatchOperation::Remove(RemoveOperation { path: at_index }));
    Some(Patch(operations))
}

/// The merge patch adding `finalizer`, with the object's resourceVersion as precondition so
/// a list changed meanwhile is never overwritten; `None` when it is already there.
pub fn finalizer_addition_patch(meta: &ObjectMeta, finalizer: &str) -> Option<Value> {
    let mut finalizers = meta.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    finalizers.push(finalizer.to_owned());
    Some(serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": meta.resource_version }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: &str = "example.com/ours";

    fn meta(finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            uid: Some("uid-1".into()),
            resource_version: Some("42".into()),
            finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn removal_tests_the_uid_and_the_index_before_removing() {
        let patch = finalizer_removal_patch(&meta(&["kubernetes.io/pv-protection", OURS]), OURS)
            .expect("the finalizer is there");
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::json!([
                { "op": "test", "path": "/metadata/uid", "value": "uid-1" },
                { "op": "test", "path": "/metadata/finalizers/1", "value": OURS },
                { "op": "remove", "path": "/metadata/finalizers/1" },
            ])
        );
    }

    #[test]
    fn removal_applies_to_the_object_it_was_computed_from() {
        let object = serde_json::json!({
            "metadata": { "uid": "uid-1", "finalizers": ["a", OURS, "b"] }
        });
        let patch = finalizer_removal_patch(&meta(&["a", OURS, "b"]), OURS).unwrap();
        let mut patched = object.clone();
        json_patch::patch(&mut patched, &patch).unwrap();
        assert_eq!(
            patched["metadata"]["finalizers"],
            serde_json::json!(["a", "b"])
        );

        // Another controller removed "a" meanwhile: the index moved, the patch must not apply.
        let mut moved = serde_json::json!({
            "metadata": { "uid": "uid-1", "finalizers": [OURS, "b"] }
        });
        assert!(json_patch::patch(&mut moved, &patch).is_err());
        // A new object of the same name carries the finalizer at the same index: not ours.
        let mut replaced = serde_json::json!({
            "metadata": { "uid": "uid-2", "finalizers": ["a", OURS, "b"] }
        });
        assert!(json_patch::patch(&mut replaced, &patch).is_err());
    }

    #[test]
    fn nothing_to_remove_or_add_when_already_so() {
        assert!(finalizer_removal_patch(&meta(&["other"]), OURS).is_none());
        assert!(finalizer_removal_patch(&ObjectMeta::default(), OURS).is_none());
        assert!(finalizer_addition_patch(&meta(&[OURS]), OURS).is_none());
    }

    #[test]
    fn addition_keeps_other_finalizers_and_carries_the_resource_version() {
        assert_eq!(
            finalizer_addition_patch(&meta(&["other"]), OURS),
            Some(serde_json::json!({
                "metadata": { "finalizers": ["other", OURS], "resourceVersion": "42" }
            }))
        );
    }
}
