//! An in-memory API server with the semantics the sidecar relies on: objects as JSON by
//! (resource, namespace, name), a resourceVersion bumped on every write, optimistic
//! concurrency (409 Conflict on a stale PUT or a failed precondition), 409 AlreadyExists on a
//! POST of an existing name, 404 NotFound `Status` objects, finalizers (a DELETE of an object
//! with finalizers marks it; emptying the finalizers of a marked object removes it), merge
//! patches (RFC 7386) and JSON patches (RFC 6902, a failed `test` is 422), label selectors on
//! lists.
//!
//! Each sidecar process reaches it through its own [`ProcessService`] (a tower service behind
//! a real `kube::Client`): requests of a crashed process never get an answer, and requests
//! made by an actor (a reconcile the scheduler drives) wait at the [`Gate`] until the scheduler
//! lets them through. Requests of background tasks (journal writers, the event recorder) are
//! answered at once.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context as TaskContext, Poll};

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

use super::gate::{Gate, ProcId};
use super::trace::Trace;

/// Where an object lives: its resource (plural), namespace ("" for cluster-scoped) and name.
pub type Key = (String, String, String);

#[derive(Default)]
pub struct Store {
    pub objects: BTreeMap<Key, Value>,
    pub version: u64,
    next_uid: u64,
    /// Events accepted (and dropped).
    pub events: u64,
    /// Every journal write that was stored: the writing process and the records it holds.
    pub journal_writes: Vec<(ProcId, Vec<String>)>,
    /// Every selected node a process gave back (a JSON patch removing the annotation from a
    /// claim): the process and the claim's volume name (`pvc-<uid>`).
    pub given_back: Vec<(ProcId, String)>,
}

/// The API server's state, shared by every process's service.
#[derive(Clone, Default)]
pub struct ApiServer {
    store: Arc<Mutex<Store>>,
}

/// A fixed creation and deletion time: the reconcilers only test for presence.
const TIMESTAMP: &str = "2026-01-01T00:00:00Z";

impl ApiServer {
    pub fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Objects of `resource` (any namespace), sorted by namespace and name.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((r, _, _), _)| r == resource)
            .map(|(_, object)| object.clone())
            .collect()
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(resource.to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Creates an object as a client outside the sidecar would (the test's actors).
    pub fn create(&self, resource: &str, object: Value) -> Result<Value, u16> {
        let namespace = text(&object["metadata"]["namespace"]).to_owned();
        let mut store = self.lock();
        store
            .create(resource, &namespace, object)
            .map_err(|(code, _)| code)
    }

    /// Writes `object` unconditionally (an outside writer: the binder, an admin), keeping
    /// uid and bumping the resourceVersion; an object left with a deletionTimestamp and no
    /// finalizers is removed.
    pub fn put(&self, resource: &str, object: Value) {
        let key = key_of(resource, &object);
        let mut store = self.lock();
        store.write(key, object);
    }

    /// Deletes as `kubectl delete` would (finalizers mark the object).
    pub fn delete(&self, resource: &str, namespace: &str, name: &str) -> bool {
        let key = (resource.to_owned(), namespace.to_owned(), name.to_owned());
        self.lock().delete(&key, &Value::Null).is_ok()
    }
}

fn key_of(resource: &str, object: &Value) -> Key {
    (
        resource.to_owned(),
        text(&object["metadata"]["namespace"]).to_owned(),
        text(&object["metadata"]["name"]).to_owned(),
    )
}

pub fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

type Failure = (u16, Value);

impl Store {
    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    fn create(
        &mut self,
        resource: &str,
        namespace: &str,
        mut object: Value,
    ) -> Result<Value, Failure> {
        let name = text(&object["metadata"]["name"]).to_owned();
        if name.is_empty() {
            return Err(status(422, "Invalid", "metadata.name: Required value"));
        }
        let key = (resource.to_owned(), namespace.to_owned(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(status(
                409,
                "AlreadyExists",
                &format!("{resource} \"{name}\" already exists"),
            ));
        }
        self.next_uid += 1;
        let uid = format!("uid-{:04}", self.next_uid);
        let version = self.bump();
        let metadata = object["metadata"].as_object_mut().expect("metadata");
        metadata.insert("uid".into(), json!(uid));
        metadata.insert("resourceVersion".into(), json!(version));
        metadata.insert("creationTimestamp".into(), json!(TIMESTAMP));
        metadata.remove("deletionTimestamp");
        if !namespace.is_empty() {
            metadata.insert("namespace".into(), json!(namespace));
        }
        self.objects.insert(key, object.clone());
        Ok(object)
    }

    /// Stores `object` under `key` with a new resourceVersion (removing it if it is marked
    /// and has no finalizers left); returns what is stored, or the deleted object.
    fn write(&mut self, key: Key, mut object: Value) -> Value {
        let version = self.bump();
        object["metadata"]["resourceVersion"] = json!(version);
        let marked = !object["metadata"]["deletionTimestamp"].is_null();
        let finalizers = object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|list| !list.is_empty());
        if marked && !finalizers {
            self.objects.remove(&key);
        } else {
            self.objects.insert(key, object.clone());
        }
        object
    }

    fn delete(&mut self, key: &Key, options: &Value) -> Result<Value, Failure> {
        let Some(current) = self.objects.get(key).cloned() else {
            return Err(not_found(key));
        };
        let preconditions = &options["preconditions"];
        if let Some(uid) = preconditions["uid"].as_str()
            && uid != text(&current["metadata"]["uid"])
        {
            return Err(status(409, "Conflict", "Precondition failed: UID"));
        }
        if let Some(version) = preconditions["resourceVersion"].as_str()
            && version != text(&current["metadata"]["resourceVersion"])
        {
            return Err(status(
                409,
                "Conflict",
                "Precondition failed: ResourceVersion",
            ));
        }
        let finalizers = current["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|list| !list.is_empty());
        if finalizers {
            if !current["metadata"]["deletionTimestamp"].is_null() {
                return Ok(current);
            }
            let mut marked = current;
            marked["metadata"]["deletionTimestamp"] = json!(TIMESTAMP);
            return Ok(self.write(key.clone(), marked));
        }
        self.objects.remove(key);
        self.bump();
        Ok(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Success", "details": {"name": key.2, "uid": current["metadata"]["uid"]},
        }))
    }

    fn handle(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        content: &str,
        body: Value,
    ) -> Result<(u16, Value), Failure> {
        let Some(route) = Route::parse(path) else {
            return Err(status(404, "NotFound", &format!("no route {path}")));
        };
        if route.resource == "events" {
            self.events += 1;
            return Ok((201, body));
        }
        let key = (
            route.resource.clone(),
            route.namespace.clone(),
            route.name.clone().unwrap_or_default(),
        );
        match (method.clone(), route.name.is_some()) {
            (Method::GET, false) => {
                let selector = query_param(query, "labelSelector");
                let items: Vec<Value> = self
                    .objects
                    .iter()
                    .filter(|((r, ns, _), object)| {
                        *r == route.resource
                            && (route.namespace.is_empty() || *ns == route.namespace)
                            && selector
                                .as_deref()
                                .is_none_or(|s| matches_selector(object, s))
                    })
                    .map(|(_, object)| object.clone())
                    .collect();
                Ok((
                    200,
                    json!({
                        "apiVersion": route.api_version,
                        "kind": "List",
                        "metadata": {"resourceVersion": self.version.to_string()},
                        "items": items,
                    }),
                ))
            }
            (Method::POST, false) => {
                let created = self.create(&route.resource, &route.namespace, body)?;
                Ok((201, created))
            }
            (Method::GET, true) => self
                .objects
                .get(&key)
                .cloned()
                .map(|o| (200, o))
                .ok_or_else(|| not_found(&key)),
            (Method::PUT, true) => {
                let Some(current) = self.objects.get(&key).cloned() else {
                    return Err(not_found(&key));
                };
                let sent_version = text(&body["metadata"]["resourceVersion"]);
                if !sent_version.is_empty()
                    && sent_version != text(&current["metadata"]["resourceVersion"])
                {
                    return Err(conflict(&key));
                }
                let mut object = body;
                keep_system_fields(&current, &mut object);
                Ok((200, self.write(key, object)))
            }
            (Method::PATCH, true) => {
                let Some(current) = self.objects.get(&key).cloned() else {
                    return Err(not_found(&key));
                };
                let mut object = current.clone();
                if content.contains("json-patch") {
                    let patch: json_patch::Patch = serde_json::from_value(body)
                        .map_err(|e| status(400, "BadRequest", &e.to_string()))?;
                    if let Err(error) = json_patch::patch(&mut object, &patch) {
                        return Err(status(
                            422,
                            "Invalid",
                            &format!("the patch failed: {error}"),
                        ));
                    }
                } else {
                    let sent_version = text(&body["metadata"]["resourceVersion"]).to_owned();
                    if !sent_version.is_empty()
                        && sent_version != text(&current["metadata"]["resourceVersion"])
                    {
                        return Err(conflict(&key));
                    }
                    json_patch::merge(&mut object, &body);
                }
                keep_system_fields(&current, &mut object);
                Ok((200, self.write(key, object)))
            }
            (Method::DELETE, true) => self.delete(&key, &body).map(|o| (200, o)),
            _ => Err(status(405, "MethodNotAllowed", &format!("{method} {path}"))),
        }
    }
}

/// uid, creation and deletion marks are the server's, whatever a write sends.
fn keep_system_fields(current: &Value, object: &mut Value) {
    for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
        match current["metadata"].get(field) {
            Some(value) => object["metadata"][field] = value.clone(),
            None => {
                if let Some(metadata) = object["metadata"].as_object_mut() {
                    metadata.remove(field);
                }
            }
        }
    }
}

fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(byte) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `k=v`, `k!=v`, `k`, `!k` terms, comma-separated, all of which must hold.
pub fn matches_selector(object: &Value, selector: &str) -> bool {
    let labels = &object["metadata"]["labels"];
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        if let Some((key, value)) = term.split_once("!=") {
            labels[key].as_str() != Some(value)
        } else if let Some((key, value)) = term.split_once('=') {
            labels[key].as_str() == Some(value.trim_start_matches('='))
        } else if let Some(key) = term.strip_prefix('!') {
            labels.get(key).is_none()
        } else {
            labels.get(term).is_some()
        }
    })
}

struct Route {
    api_version: String,
    resource: String,
    namespace: String,
    name: Option<String>,
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (api_version, rest) = match parts.as_slice() {
            ["api", version, rest @ ..] => ((*version).to_owned(), rest),
            ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                ((*namespace).to_owned(), rest)
            }
            rest => (String::new(), rest),
        };
        let (resource, name) = match rest {
            [resource] => ((*resource).to_owned(), None),
            [resource, name] => ((*resource).to_owned(), Some((*name).to_owned())),
            _ => return None,
        };
        Some(Route {
            api_version,
            resource,
            namespace,
            name,
        })
    }
}

fn status(code: u16, reason: &str, message: &str) -> Failure {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason, "code": code,
        }),
    )
}

fn not_found(key: &Key) -> Failure {
    let (code, mut body) = status(
        404,
        "NotFound",
        &format!("{} \"{}\" not found", key.0, key.2),
    );
    body["details"] = json!({"name": key.2, "kind": key.0});
    (code, body)
}

fn conflict(key: &Key) -> Failure {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {} \"{}\": the object has been modified; please apply your changes to the latest version and try again",
            key.0, key.2
        ),
    )
}

/// One process's connection to the API server.
#[derive(Clone)]
pub struct ProcessService {
    pub server: ApiServer,
    pub gate: Gate,
    pub proc: ProcId,
    pub trace: Trace,
}

impl tower::Service<Request<Body>> for ProcessService {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = body.collect_bytes().await.unwrap_or_default();
            let sent: Value = if body.is_empty() {
                Value::Null
            } else {
                serde_json::from_slice(&body).unwrap_or(Value::Null)
            };
            let sent_text = sent.to_string();
            let path = parts.uri.path().to_owned();
            let query = parts.uri.query().unwrap_or_default().to_owned();
            let content = parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let short = short_path(&path);
            let is_event = path.contains("/events");
            let what = format!("{} {short}", parts.method);
            let actor = if is_event {
                this.gate.pass_ungated(this.proc).await
            } else {
                this.gate.pass(this.proc, &what).await
            };
            // A journal write says which records it stores.
            let journal_write = path.contains("provisioningjournals")
                && (parts.method == Method::PUT || parts.method == Method::POST);
            let names: Vec<String> = sent["spec"]["operations"]
                .as_array()
                .map(|ops| {
                    ops.iter()
                        .map(|op| text(&op["volumeName"]).to_owned())
                        .collect()
                })
                .unwrap_or_default();
            let records = if journal_write {
                format!(" [{}]", names.join(", "))
            } else {
                String::new()
            };
            let (code, object) = {
                let mut store = this.server.lock();
                let result = store.handle(&parts.method, &path, &query, &content, sent);
                let (code, object) = result.unwrap_or_else(|failure| failure);
                if journal_write && code < 300 {
                    store.journal_writes.push((this.proc, names));
                }
                let gives_back = parts.method == Method::PATCH
                    && path.contains("/persistentvolumeclaims/")
                    && content.contains("json-patch")
                    && sent_text.contains("selected-node")
                    && sent_text.contains("\"remove\"");
                if gives_back && code < 300 {
                    let volume = format!("pvc-{}", text(&object["metadata"]["uid"]));
                    store.given_back.push((this.proc, volume));
                }
                (code, object)
            };
            if !is_event {
                let outcome = if code < 300 {
                    code.to_string()
                } else {
                    format!("{code} {}", text(&object["reason"]))
                };
                this.trace.call(
                    this.proc,
                    actor.as_deref(),
                    &format!("{what}{records} → {outcome}"),
                );
            }
            let response = Response::builder()
                .status(code)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(Body::from(serde_json::to_vec(&object).expect("JSON")))
                .expect("a valid response");
            Ok(response)
        })
    }
}

/// A path without its API group prefix, for the trace.
fn short_path(path: &str) -> String {
    let path = path
        .strip_prefix("/api/v1/")
        .or_else(|| path.strip_prefix("/apis/provisioner.csi-rs.dev/v1alpha1/"))
        .or_else(|| path.strip_prefix("/apis/snapshot.storage.k8s.io/v1/"))
        .or_else(|| path.strip_prefix("/apis/storage.k8s.io/v1/"))
        .unwrap_or(path);
    path.replace("namespaces/", "")
        .replace("persistentvolumeclaims", "pvc")
        .replace("persistentvolumes", "pv")
        .replace("provisioningjournals", "journal")
        .replace("volumesnapshots", "snapshot")
}
