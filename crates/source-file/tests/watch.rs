//! The file source against a real file system: edits, broken edits, editor-style replacement.

use std::time::Duration;

use kpng_model::{Event, Object};
use kpng_source_file::{DELETE_QUIET, FIRST_LIST_WAIT, FileSource};
use tokio::sync::mpsc;

fn manifest(ip: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{namespace: ns, name: web}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
    )
}

/// Service `ns/NAME` with ClusterIP `ip`, port 80.
fn service(name: &str, ip: &str) -> String {
    format!(
        "kind: Service\nmetadata: {{namespace: ns, name: {name}}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n"
    )
}

fn cluster_ip(event: &Event) -> String {
    let Event::Replace { objects, .. } = event else {
        panic!("expected Replace, got {event:?}")
    };
    let Some(Object::Service(svc)) = objects.first() else {
        panic!("expected a Service")
    };
    svc.cluster_ips
        .first()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// The file source on `path` (a file or a directory): its events, its input's health record
/// and its task.
/// The source watching `path`, one event per object changed: a file's changes sent as one
/// [`Event::Changes`] are handed over as their deletions then their applies.
fn watch(
    path: &std::path::Path,
) -> (
    mpsc::Receiver<Event>,
    kpng_model::input::InputHealth,
    tokio::task::JoinHandle<Result<(), kpng_source_file::SourceError>>,
) {
    let (mut raw, health, task) = watch_raw(path);
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        while let Some(event) = raw.recv().await {
            let one_by_one = match event {
                Event::Changes { deleted, applied } => deleted
                    .into_iter()
                    .map(Event::Delete)
                    .chain(applied.into_iter().map(Event::Apply))
                    .collect(),
                other => vec![other],
            };
            for event in one_by_one {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
    });
    (rx, health, task)
}

/// The source watching `path`, its events as it sends them.
fn watch_raw(
    path: &std::path::Path,
) -> (
    mpsc::Receiver<Event>,
    kpng_model::input::InputHealth,
    tokio::task::JoinHandle<Result<(), kpng_source_file::SourceError>>,
) {
    let (tx, rx) = mpsc::channel(8);
    let metrics = kpng_source_file::SourceMetrics::default();
    let health = metrics.health.clone();
    let source = FileSource::new(path, Duration::from_millis(50)).with_metrics(metrics);
    (rx, health, tokio::spawn(source.run(tx)))
}

/// The input's problems now: (what, message).
fn problems_of(health: &kpng_model::input::InputHealth) -> Vec<(String, String)> {
    health
        .state()
        .problems
        .into_iter()
        .map(|(what, p)| (what, p.message))
        .collect()
}

/// The input's problems once it has one (at most 10 s from now).
async fn first_problems(health: &kpng_model::input::InputHealth) -> Vec<(String, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while problems_of(health).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    problems_of(health)
}

async fn next(rx: &mut mpsc::Receiver<Event>) -> Option<Event> {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .ok()
        .flatten()
}

/// Asserts that the next event is `what`: a whole load (every kind listed) of `objects`
/// objects.
async fn assert_whole_list(rx: &mut mpsc::Receiver<Event>, objects: usize, what: &str) {
    match next(rx).await {
        Some(Event::Replace {
            kinds,
            objects: got,
        }) => {
            assert_eq!(kinds.len(), 4, "a whole load lists every kind");
            assert_eq!(got.len(), objects, "{what}: {got:?}");
        }
        other => panic!("expected {what}, got {other:?}"),
    }
}

#[tokio::test]
async fn edits_are_sent_broken_edits_are_not_and_replaced_files_are_still_watched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, manifest("10.96.0.1")).expect("write");
    let (mut rx, health, task) = watch(&path);

    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("initial load")),
        "10.96.0.1"
    );
    let loaded = health.state();
    assert_eq!(loaded.source, format!("file {}", path.display()));
    assert!(loaded.problems.is_empty(), "{loaded:?}");
    assert_eq!(loaded.detail.as_deref(), Some("1 objects"));
    assert!(loaded.last_good.is_some());

    // An in-place edit.
    std::fs::write(&path, manifest("10.96.0.2")).expect("write");
    assert_eq!(cluster_ip(&next(&mut rx).await.expect("edit")), "10.96.0.2");

    // A broken object is sent as rejected, naming the file and the field: the model keeps its
    // last good version (the rest of the file would load). Being the file's last object, it
    // comes on its own, so that nothing else is deleted (as for a file cut off mid-write).
    std::fs::write(&path, "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.9, ports: [{port: 0}]}\n").expect("write");
    match next(&mut rx).await {
        Some(Event::Apply(Object::Rejected(e))) => {
            assert_eq!(&*e.object.name, "web");
            assert_eq!(e.field, "spec.ports[0].port");
            let at = e.location.as_deref().unwrap_or_default();
            assert!(at.ends_with("cluster.yaml: document 1 (line 1)"), "{at}");
        }
        other => panic!("expected web rejected, got {other:?}"),
    }
    // A file that does not read is the input's problem (`kpng status`), saying the last good
    // state is in use; it sends nothing (the last good state stays). The problem says the
    // source has read the edit: no event before that window proves anything.
    std::fs::write(
        &path,
        "kind: Service\nmetadata: {namespace: ns, name: [web\n",
    )
    .expect("write");
    let problems = first_problems(&health).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(600), rx.recv())
            .await
            .is_err(),
        "unreadable edit was sent"
    );
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (what, message) = &problems[0];
    assert_eq!(what, &path.display().to_string());
    assert!(
        message.starts_with("not loaded: document 1 (line 1)")
            && message.ends_with("; keeping the last good state"),
        "{message}"
    );

    // An editor that writes a new file and renames it over the old one.
    let tmp = dir.path().join(".cluster.yaml.swp");
    std::fs::write(&tmp, manifest("10.96.0.3")).expect("write");
    std::fs::rename(&tmp, &path).expect("rename");
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("replace")),
        "10.96.0.3"
    );
    assert_eq!(
        problems_of(&health),
        [],
        "the problem ends with a good load"
    );

    // And later edits of the replaced file are still seen.
    std::fs::write(&path, manifest("10.96.0.4")).expect("write");
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("edit after replace")),
        "10.96.0.4"
    );

    task.abort();
}

#[tokio::test]
async fn a_directory_is_read_per_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), service("a", "10.96.0.1")).expect("write");
    std::fs::write(dir.path().join("b.yaml"), service("b", "10.96.0.2")).expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not a manifest").expect("write");
    let (mut rx, health, task) = watch(dir.path());

    // The first load is streamed: ListStart, one ListItem per object, ListDone.
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));

    // Changing one file sends only its objects.
    std::fs::write(dir.path().join("b.yaml"), service("b", "10.96.0.3")).expect("write");
    match next(&mut rx).await {
        Some(Event::Apply(Object::Service(s))) => assert_eq!(&*s.key.name, "b"),
        other => panic!("expected Apply of b, got {other:?}"),
    }
    // A broken file keeps its objects; removing a file deletes them.
    std::fs::write(
        dir.path().join("a.yaml"),
        "kind: Service\nmetadata: {name: [\n",
    )
    .expect("write");
    // Once the source has read it (its problem recorded), nothing is sent.
    let problems = first_problems(&health).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err()
    );
    let a = dir.path().join("a.yaml").display().to_string();
    assert!(
        matches!(problems.as_slice(), [(what, message)]
            if *what == a && message.ends_with("; keeping its last good state")),
        "{problems:?}"
    );
    std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
    match next(&mut rx).await {
        Some(Event::Delete(r)) => assert_eq!(&*r.name, "a"),
        other => panic!("expected Delete of a, got {other:?}"),
    }
    assert_eq!(problems_of(&health), [], "a removed file has no problem");
    // A new file that does not read has nothing of it in use.
    std::fs::write(
        dir.path().join("c.yaml"),
        "kind: Service
metadata: {name: [
",
    )
    .expect("write");
    let c = dir.path().join("c.yaml").display().to_string();
    let problems = first_problems(&health).await;
    assert!(
        matches!(problems.as_slice(), [(what, message)]
            if *what == c && message.ends_with("; nothing from it is in use until it loads")),
        "{problems:?}"
    );
    task.abort();
}

#[tokio::test]
async fn a_symlink_into_another_directory_and_a_recreated_directory_are_followed() {
    let root = tempfile::tempdir().expect("tempdir");
    // The input is a symlink in `watched/` to a file in `data/`: a change in `data/` makes no
    // event where the source watches, as with a link to a ConfigMap elsewhere.
    let data = root.path().join("data");
    let watched = root.path().join("watched");
    std::fs::create_dir_all(&data).expect("mkdir");
    std::fs::create_dir_all(&watched).expect("mkdir");
    let real = data.join("real.yaml");
    std::fs::write(&real, manifest("10.96.0.1")).expect("write");
    let link = watched.join("cluster.yaml");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let metrics = kpng_source_file::SourceMetrics::default();
    let (tx, mut rx) = mpsc::channel(8);
    let task = tokio::spawn(
        FileSource::new(&link, Duration::from_millis(50))
            .with_metrics(metrics.clone())
            .run(tx),
    );
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("initial")),
        "10.96.0.1"
    );
    assert!(metrics.health.state().last_good.is_some());

    let tmp = data.join(".real.yaml.tmp");
    std::fs::write(&tmp, manifest("10.96.0.2")).expect("write");
    std::fs::rename(&tmp, &real).expect("rename");
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("change behind the link")),
        "10.96.0.2"
    );

    // The watched directory is deleted and re-created (with the link): still followed.
    std::fs::remove_dir_all(&watched).expect("rm");
    std::fs::create_dir_all(&watched).expect("mkdir");
    std::fs::write(&tmp, manifest("10.96.0.3")).expect("write");
    std::fs::rename(&tmp, &real).expect("rename");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("after the directory came back")),
        "10.96.0.3"
    );
    std::fs::write(&link, manifest("10.96.0.4")).expect("write through the link");
    assert_eq!(
        cluster_ip(
            &next(&mut rx)
                .await
                .expect("edit in the re-created directory")
        ),
        "10.96.0.4"
    );

    // An unreadable version is counted once it has been quiet.
    std::fs::write(
        &tmp,
        "kind: Service\nmetadata: {namespace: ns, name: [web\n",
    )
    .expect("write");
    std::fs::rename(&tmp, &real).expect("rename");
    let parse_errors = || {
        metrics
            .errors
            .get_or_create(&kpng_source_file::ReasonLabel {
                reason: "parse".into(),
            })
            .get()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while parse_errors() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no parse error counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
}

/// An object defined in two files of a large directory (read on several threads): the file last
/// by name wins, as with one reader. The two copies sit at the end of the first thread's share
/// and the start of the second's, so without settling the loser would usually arrive last.
#[tokio::test]
async fn an_object_in_two_files_of_a_large_directory_is_the_last_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..300u32 {
        let text = match i {
            149 => service("dup", "10.96.200.1"),
            150 => service("dup", "10.96.200.2"),
            _ => service(
                &format!("s{i}"),
                &format!("10.96.{}.{}", i / 200, i % 200 + 1),
            ),
        };
        std::fs::write(dir.path().join(format!("f{i:03}.yaml")), text).expect("write");
    }
    let (tx, mut rx) = mpsc::channel(1024);
    let task = tokio::spawn(FileSource::new(dir.path(), Duration::from_millis(50)).run(tx));
    let mut last_dup = None;
    let mut items = 0;
    loop {
        match next(&mut rx).await.expect("first load") {
            Event::ListStart { .. } => {}
            Event::ListItem(Object::Service(s)) => {
                items += 1;
                if &*s.key.name == "dup" {
                    last_dup = s.cluster_ips.first().map(ToString::to_string);
                }
            }
            Event::ListDone { .. } => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(items >= 300, "{items} items");
    assert_eq!(last_dup.as_deref(), Some("10.96.200.2"));
    task.abort();
}

/// `path` as a path relative to the current directory (`../../tmp/…`), without changing the
/// current directory (which every test of this binary shares).
fn relative_to_current_dir(path: &std::path::Path) -> std::path::PathBuf {
    let cwd = std::env::current_dir().expect("current directory");
    let up = cwd.components().count().saturating_sub(1);
    let mut relative: std::path::PathBuf = std::iter::repeat_n("..", up).collect();
    relative.push(path.strip_prefix("/").expect("an absolute path"));
    relative
}

#[tokio::test]
async fn a_directory_given_by_a_relative_path_applies_the_removal_of_a_file_read_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), service("a", "10.96.0.1")).expect("write");
    std::fs::write(dir.path().join("b.yaml"), service("b", "10.96.0.2")).expect("write");
    let relative = relative_to_current_dir(dir.path());
    assert!(relative.is_relative() && relative.is_dir(), "{relative:?}");
    let (mut rx, _health, task) = watch_raw(&relative);
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));

    std::fs::remove_file(dir.path().join("a.yaml")).expect("remove");
    match next(&mut rx).await {
        Some(Event::Delete(r)) => assert_eq!(&*r.name, "a"),
        other => panic!("expected Delete of a, got {other:?}"),
    }
    // A file read at start and replaced atomically without its object deletes it at once.
    let tmp = dir.path().join(".b.yaml.tmp");
    std::fs::write(&tmp, service("c", "10.96.0.3")).expect("write");
    std::fs::rename(&tmp, dir.path().join("b.yaml")).expect("rename");
    // One event: the file's objects change together.
    match next(&mut rx).await {
        Some(Event::Changes { deleted, applied }) => {
            assert!(
                matches!(deleted.as_slice(), [r] if &*r.name == "b"),
                "{deleted:?}"
            );
            assert!(
                matches!(applied.as_slice(), [Object::Service(s)] if &*s.key.name == "c"),
                "{applied:?}"
            );
        }
        other => panic!("expected Delete of b and Apply of c, got {other:?}"),
    }
    task.abort();
}

#[tokio::test]
async fn a_path_missing_at_start_that_becomes_a_directory_is_read_as_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("manifests");
    let (mut rx, health, task) = watch(&path);
    let problems = first_problems(&health).await;
    assert_eq!(problems.len(), 1, "{problems:?}");

    // Made elsewhere and moved in whole, as a volume appears.
    let staging = dir.path().join(".staging");
    std::fs::create_dir(&staging).expect("mkdir");
    std::fs::write(
        staging.join("web.yaml"),
        "kind: Service\nmetadata: {namespace: ns, name: web}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n",
    )
    .expect("write");
    std::fs::rename(&staging, &path).expect("rename");
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    match next(&mut rx).await {
        Some(Event::ListItem(Object::Service(s))) => assert_eq!(&*s.key.name, "web"),
        other => panic!("expected web listed, got {other:?}"),
    }
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));
    assert_eq!(problems_of(&health), []);
    assert_eq!(
        health.state().source,
        format!("directory {}", path.display())
    );

    // And it is watched as a directory from then on.
    std::fs::remove_file(path.join("web.yaml")).expect("remove");
    match next(&mut rx).await {
        Some(Event::Delete(r)) => assert_eq!(&*r.name, "web"),
        other => panic!("expected Delete of web, got {other:?}"),
    }
    task.abort();
}

#[tokio::test]
async fn a_directory_with_a_broken_file_at_start_is_applied_once_every_file_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), service("a", "10.96.0.1")).expect("write");
    std::fs::write(
        dir.path().join("b.yaml"),
        "kind: Service\nmetadata: {name: [\n",
    )
    .expect("write");
    let (mut rx, health, task) = watch_raw(dir.path());
    // The list is started and never completed: a complete list without b's objects would
    // remove them (from every node of a brain) although b is only broken.
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    let problems = first_problems(&health).await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "the list was completed without b"
    );
    // b fixed: the directory is listed again, whole.
    let tmp = dir.path().join(".b.yaml.tmp");
    std::fs::write(&tmp, service("b", "10.96.0.2")).expect("write");
    std::fs::rename(&tmp, dir.path().join("b.yaml")).expect("rename");
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    let mut listed = Vec::new();
    loop {
        match next(&mut rx).await {
            Some(Event::ListItem(Object::Service(s))) => listed.push(s.key.name.to_string()),
            Some(Event::ListDone { .. }) => break,
            other => panic!("expected the list, got {other:?}"),
        }
    }
    listed.sort();
    assert_eq!(listed, ["a", "b"]);
    assert_eq!(problems_of(&health), []);
    task.abort();
}

#[tokio::test]
async fn a_manifest_in_a_missing_directory_is_an_error_naming_the_directory() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let missing = dir.path().join("not-mounted");
    let (tx, _rx) = mpsc::channel(4);
    let err = FileSource::new(missing.join("cluster.yaml"), Duration::from_millis(50))
        .run(tx)
        .await
        .expect_err("nothing to watch");
    let text = err.to_string();
    assert!(
        text.contains(&missing.display().to_string()) && text.contains("no such directory"),
        "{text}"
    );
}

#[tokio::test]
async fn a_file_missing_at_start_is_a_problem_until_it_loads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    let (mut rx, health, task) = watch(&path);
    let problems = first_problems(&health).await;
    assert!(
        matches!(problems.as_slice(), [(what, message)]
            if *what == path.display().to_string()
                && message.starts_with("cannot read it: ")
                && message.ends_with("; nothing from it is in use until it loads")),
        "{problems:?}"
    );
    assert_eq!(health.state().last_good, None);
    std::fs::write(&path, manifest("10.96.0.1")).expect("write");
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("the file, once written")),
        "10.96.0.1"
    );
    assert_eq!(problems_of(&health), []);
    assert!(health.state().last_good.is_some());
    task.abort();
}

#[tokio::test]
async fn going_back_to_the_version_in_use_ends_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    let good = manifest("10.96.0.1");
    std::fs::write(&path, &good).expect("write");
    let (mut rx, health, task) = watch(&path);
    assert_eq!(
        cluster_ip(&next(&mut rx).await.expect("initial load")),
        "10.96.0.1"
    );
    let replace = |text: &str| {
        let tmp = dir.path().join(".cluster.yaml.tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &path).expect("rename");
    };
    replace("kind: Service\nmetadata: {name: [web\n");
    assert_eq!(first_problems(&health).await.len(), 1);
    // The edit undone: the model already has this version (nothing is sent), and the input
    // has no problem any more.
    replace(&good);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while !problems_of(&health).is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(problems_of(&health), [], "the undone edit ends the problem");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "the version in use is not sent again"
    );
    task.abort();
}

/// Where a write of [`three_services`] is cut off: inside `b`'s protocol.
const B_CUT: &str = "10.96.0.2\n  ports:\n  - port: 80\n    protocol: TC";

/// Services `a`, `b` and `c` in block style, `b` cut off mid-write at `cut` when given.
fn three_services(cut: Option<&str>) -> String {
    let block = |name: &str, ip: &str| {
        format!(
            "kind: Service\nmetadata:\n  namespace: ns\n  name: {name}\nspec:\n  clusterIP: {ip}\n  ports:\n  - port: 80\n    protocol: TCP\n"
        )
    };
    let whole = format!(
        "{}---\n{}---\n{}",
        block("a", "10.96.0.1"),
        block("b", "10.96.0.2"),
        block("c", "10.96.0.3")
    );
    match cut.and_then(|at| whole.find(at).map(|i| i + at.len())) {
        Some(end) => whole[..end].to_string(),
        None => whole,
    }
}

#[tokio::test]
async fn a_file_cut_off_mid_write_deletes_nothing_until_its_end_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, health, task) = watch(&path);
    assert_whole_list(&mut rx, 3, "the first load").await;
    // Cut inside b's protocol: b is rejected and c is missing. The load applies a, keeps b's
    // last good version (the model does), and must not delete c.
    std::fs::write(&path, three_services(Some(B_CUT))).expect("write");
    match (next(&mut rx).await, next(&mut rx).await) {
        (Some(Event::Apply(Object::Service(a))), Some(Event::Apply(Object::Rejected(b)))) => {
            assert_eq!((&*a.key.name, &*b.object.name), ("a", "b"));
        }
        other => panic!("expected a applied and b rejected, one by one, got {other:?}"),
    }
    assert_held_back(&health, &path);
    // Once the end reads, what the file no longer has goes (once the file has been quiet).
    let two = three_services(None);
    let two = &two[..two.rfind("---").expect("separator")];
    std::fs::write(&path, two).expect("write");
    assert_eq!(deleted_once_quiet(&mut rx).await, ["c"]);
    assert_eq!(problems_of(&health), [], "the file is whole again");
    task.abort();
}

#[tokio::test]
async fn a_directory_file_cut_off_mid_write_deletes_nothing_until_its_end_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("services.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, health, task) = watch(dir.path());
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    for _ in 0..3 {
        assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    }
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));
    std::fs::write(&path, three_services(Some(B_CUT))).expect("write");
    // The first event whenever the source reads the cut file; the rest of its burst after.
    let mut events = vec![next(&mut rx).await.expect("the cut file read")];
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(700), rx.recv()).await {
        events.push(event);
    }
    assert!(
        !events.iter().any(|e| matches!(e, Event::Delete(_))),
        "c was deleted: {events:?}"
    );
    assert_eq!(events.len(), 2, "a applied, b rejected: {events:?}");
    assert_held_back(&health, &path);
    // The clean version without c deletes it: the held object is still the file's.
    let two = three_services(None);
    std::fs::write(&path, &two[..two.rfind("---").expect("separator")]).expect("write");
    assert_eq!(deleted_once_quiet(&mut rx).await, ["c"]);
    assert_eq!(problems_of(&health), [], "the file is whole again");
    task.abort();
}

/// The cut-off `path`'s held deletion is its input problem (`kpng status`,
/// `kpng_input_problems`), naming the file and that deletions wait for it to be whole: until
/// 2026-12-07 only a WARNING line said so, and the status read `ok`.
#[track_caller]
fn assert_held_back(health: &kpng_model::input::InputHealth, path: &std::path::Path) {
    let problems = problems_of(health);
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (what, message) = &problems[0];
    assert_eq!(what, &path.to_string_lossy(), "{problems:?}");
    assert!(
        message.contains("1 object no longer in it is kept, not deleted")
            && message.contains("deletions are held back until the file is whole"),
        "{message}"
    );
}

/// A ConfigMap mounted as kubelet mounts it: each key a symlink through `..data` into a
/// timestamped directory, updated by swapping `..data` (write `..<new>/`, link `..data_tmp` to
/// it, rename that over `..data`, remove the old directory). No event names the manifest, yet
/// its content changed: the directory source must follow it, as the file source does.
#[tokio::test]
async fn a_directory_follows_a_configmap_swap_of_its_data_link() {
    let root = tempfile::tempdir().expect("tempdir");
    let cm = root.path().join("cm");
    let version = |name: &str, ip: &str| {
        let dir = cm.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("services.yaml"), manifest(ip)).expect("write");
    };
    version("..2026_01", "10.96.0.1");
    std::os::unix::fs::symlink("..2026_01", cm.join("..data")).expect("symlink");
    std::os::unix::fs::symlink("..data/services.yaml", cm.join("services.yaml")).expect("symlink");
    let (mut rx, _health, task) = watch(&cm);
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    match next(&mut rx).await {
        Some(Event::ListItem(Object::Service(s))) => {
            assert_eq!(
                s.cluster_ips.first().map(ToString::to_string).as_deref(),
                Some("10.96.0.1")
            );
        }
        other => panic!("expected the Service, got {other:?}"),
    }
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));

    // kubelet's swap.
    version("..2026_02", "10.96.0.2");
    std::os::unix::fs::symlink("..2026_02", cm.join("..data_tmp")).expect("symlink");
    std::fs::rename(cm.join("..data_tmp"), cm.join("..data")).expect("rename");
    std::fs::remove_dir_all(cm.join("..2026_01")).expect("remove the old version");
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Some(Event::Apply(Object::Service(s)))) => {
            assert_eq!(
                s.cluster_ips.first().map(ToString::to_string).as_deref(),
                Some("10.96.0.2")
            );
        }
        other => panic!("expected the new version applied, got {other:?}"),
    }
    task.abort();
}

/// The names of the objects deleted after a write just made: every event until the deletions
/// (at most 15 s), asserting that none came before the file had been quiet for
/// [`DELETE_QUIET`] (the write was before this call) and that nothing but deletions and
/// applies came.
async fn deleted_once_quiet(rx: &mut mpsc::Receiver<Event>) -> Vec<String> {
    let written = tokio::time::Instant::now();
    let deadline = written + Duration::from_secs(15);
    let mut deleted = Vec::new();
    loop {
        let wait = if deleted.is_empty() {
            deadline.saturating_duration_since(tokio::time::Instant::now())
        } else {
            // The rest of the deletions come in the same burst.
            Duration::from_millis(300)
        };
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(Event::Delete(r))) => {
                assert!(
                    written.elapsed() >= DELETE_QUIET,
                    "{} deleted {:?} after the write",
                    r.name,
                    written.elapsed()
                );
                deleted.push(r.name.to_string());
            }
            Ok(Some(Event::Apply(_))) => {}
            Ok(Some(other)) => panic!("expected applies and deletions, got {other:?}"),
            Ok(None) | Err(_) => return deleted,
        }
    }
}

/// The events within `wait`.
async fn events_within(rx: &mut mpsc::Receiver<Event>, wait: Duration) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut events = Vec::new();
    while let Ok(Some(event)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        events.push(event);
    }
    events
}

/// What in `events` removes an object: a deletion, or a list that lacks some of `a`, `b`, `c`.
fn removals(events: &[Event]) -> Vec<&Event> {
    events
        .iter()
        .filter(|e| match e {
            Event::Delete(_) => true,
            Event::Replace { objects, .. } => objects.len() < 3,
            _ => false,
        })
        .collect()
}

/// [`three_services`] as a writer that does not rename atomically leaves it after its first
/// document (a shell loop, `helm template … > file`, writing the rest a moment later).
fn first_document_only() -> String {
    let whole = three_services(None);
    whole[..whole.find("---").expect("separator")].to_string()
}

/// A file caught after its first document parses, and lacks the Services after it: they stay
/// until the file has been quiet for `DELETE_QUIET` (the rest arriving meanwhile deletes
/// nothing); what it has is applied at once; a Service really removed goes after the quiet.
#[tokio::test]
async fn a_file_caught_after_its_first_document_deletes_nothing_until_it_has_been_quiet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(&path);
    assert!(
        matches!(next(&mut rx).await, Some(Event::Replace { objects, .. }) if objects.len() == 3)
    );

    // Caught after a, the rest written as soon as a is applied (well within the quiet period).
    std::fs::write(&path, first_document_only()).expect("write");
    match next(&mut rx).await {
        Some(Event::Apply(Object::Service(a))) => assert_eq!(&*a.key.name, "a"),
        other => panic!("expected a applied on its own, got {other:?}"),
    }
    std::fs::write(&path, three_services(None)).expect("write");
    let events = events_within(&mut rx, DELETE_QUIET + Duration::from_secs(1)).await;
    assert!(removals(&events).is_empty(), "{events:?}");

    // b and c really removed: deleted, once the file has been quiet.
    std::fs::write(&path, first_document_only()).expect("write");
    assert_eq!(deleted_once_quiet(&mut rx).await, ["b", "c"]);
    task.abort();
}

/// Replaces `path` atomically with `text` (a new file renamed over it, as editors, `kubectl`
/// and kubelet's ConfigMap volumes do).
fn replace_atomically(path: &std::path::Path, text: &str) {
    let fresh = path.with_extension("new");
    std::fs::write(&fresh, text).expect("write");
    std::fs::rename(&fresh, path).expect("rename");
}

/// A file replaced atomically is whole: what it no longer has is deleted at once, not after
/// the quiet period that in-place writes wait for (file and directory).
#[tokio::test]
async fn a_file_replaced_atomically_deletes_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(&path);
    assert!(
        matches!(next(&mut rx).await, Some(Event::Replace { objects, .. }) if objects.len() == 3)
    );
    let written = tokio::time::Instant::now();
    replace_atomically(&path, &first_document_only());
    match next(&mut rx).await {
        Some(Event::Replace { objects, .. }) => assert_eq!(objects.len(), 1, "{objects:?}"),
        other => panic!("expected the one Service left as a list, got {other:?}"),
    }
    assert!(written.elapsed() < DELETE_QUIET, "{:?}", written.elapsed());
    task.abort();

    let sub = dir.path().join("d");
    std::fs::create_dir(&sub).expect("mkdir");
    let file = sub.join("services.yaml");
    std::fs::write(&file, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(&sub);
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    for _ in 0..3 {
        assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    }
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));
    let written = tokio::time::Instant::now();
    replace_atomically(&file, &first_document_only());
    let events = events_within(&mut rx, Duration::from_secs(1)).await;
    assert_eq!(
        removals(&events).len(),
        2,
        "b and c deleted at once: {events:?}"
    );
    assert!(written.elapsed() < DELETE_QUIET, "{:?}", written.elapsed());
    task.abort();
}

/// A file cut off right after a Service's `metadata:` parses (a Service without `spec`): at the
/// end of the file that is a cut-off object, so it keeps its last good version and the
/// Services after it are not deleted, however long the file stays so.
#[tokio::test]
async fn a_file_cut_off_after_a_services_metadata_deletes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(&path);
    assert!(
        matches!(next(&mut rx).await, Some(Event::Replace { objects, .. }) if objects.len() == 3)
    );
    std::fs::write(&path, three_services(Some("  name: b\n"))).expect("write");
    let events = events_within(&mut rx, DELETE_QUIET + Duration::from_secs(1)).await;
    assert!(removals(&events).is_empty(), "{events:?}");
    assert!(
        matches!(events.as_slice(), [Event::Apply(Object::Service(a)), Event::Apply(Object::Rejected(b))]
            if &*a.key.name == "a" && &*b.object.name == "b" && b.field == "spec"),
        "{events:?}"
    );
    task.abort();
}

/// The same in a directory: a file caught after its first document deletes nothing until it
/// has been quiet, and then what it lacks.
#[tokio::test]
async fn a_directory_file_caught_after_its_first_document_deletes_nothing_until_it_has_been_quiet()
{
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("services.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(dir.path());
    assert!(matches!(next(&mut rx).await, Some(Event::ListStart { .. })));
    for _ in 0..3 {
        assert!(matches!(next(&mut rx).await, Some(Event::ListItem(_))));
    }
    assert!(matches!(next(&mut rx).await, Some(Event::ListDone { .. })));

    std::fs::write(&path, first_document_only()).expect("write");
    match next(&mut rx).await {
        Some(Event::Apply(Object::Service(a))) => assert_eq!(&*a.key.name, "a"),
        other => panic!("expected a applied on its own, got {other:?}"),
    }
    std::fs::write(&path, three_services(None)).expect("write");
    let events = events_within(&mut rx, DELETE_QUIET + Duration::from_secs(1)).await;
    assert!(removals(&events).is_empty(), "{events:?}");

    std::fs::write(&path, first_document_only()).expect("write");
    assert_eq!(deleted_once_quiet(&mut rx).await, ["b", "c"]);
    task.abort();
}

/// A writer that keeps the file open while it pauses between its parts (a shell loop, `helm
/// template … > file`), longer than the debounce and than `DELETE_QUIET`: the file is read
/// once the writer closes it, so neither a partial version nor a deletion reaches the model.
#[tokio::test]
async fn a_file_written_in_parts_through_one_open_is_read_once_closed() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(None)).expect("write");
    let (mut rx, _health, task) = watch(&path);
    assert!(
        matches!(next(&mut rx).await, Some(Event::Replace { objects, .. }) if objects.len() == 3)
    );

    // The new version changes c (the same text as before would send nothing).
    let whole = three_services(None).replace("10.96.0.3", "10.96.0.33");
    let first = first_document_only();
    assert!(whole.starts_with(&first));
    let mut file = std::fs::File::create(&path).expect("open for writing");
    file.write_all(first.as_bytes()).expect("write");
    file.flush().expect("flush");
    let events = events_within(&mut rx, DELETE_QUIET + Duration::from_secs(1)).await;
    assert!(
        events.is_empty(),
        "read before the writer closed it: {events:?}"
    );
    file.write_all(&whole.as_bytes()[first.len()..])
        .expect("write");
    drop(file);
    match next(&mut rx).await {
        Some(Event::Replace { objects, .. }) => {
            assert_eq!(objects.len(), 3);
            assert!(format!("{objects:?}").contains("10.96.0.33"), "{objects:?}");
        }
        other => panic!("expected the whole new version, got {other:?}"),
    }
    task.abort();
}

/// A kpng started on a manifest cut off mid-write (a restart while a writer that does not
/// rename atomically is between its parts): the first load must not be a complete list, since
/// the runner's first sync would then remove every Service of the earlier run's rules that the
/// missing part has (crash44 finding 1: 1,797 Services unserved for 2.5 s). Its objects are
/// applied one by one (the first sync waits for the lists), the file is an input problem, and
/// the version whose end reads is the complete list.
#[tokio::test]
async fn a_file_cut_off_at_start_is_not_a_complete_list_until_its_end_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(Some(B_CUT))).expect("write");
    let (mut rx, health, task) = watch(&path);
    match (next(&mut rx).await, next(&mut rx).await) {
        (Some(Event::Apply(Object::Service(a))), Some(Event::Apply(Object::Rejected(b)))) => {
            assert_eq!((&*a.key.name, &*b.object.name), ("a", "b"));
        }
        other => panic!("expected a applied and b rejected, one by one, got {other:?}"),
    }
    let problems = first_problems(&health).await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    let (what, message) = &problems[0];
    assert_eq!(what, &path.to_string_lossy(), "{problems:?}");
    assert!(
        message.contains("cut off mid-write") && message.contains("first sync"),
        "{message}"
    );
    std::fs::write(&path, three_services(None)).expect("write");
    assert_whole_list(&mut rx, 3, "the complete list once the file is whole").await;
    assert_eq!(problems_of(&health), [], "the file is whole");
    task.abort();
}

/// A file that still ends rejected after [`FIRST_LIST_WAIT`] unchanged is taken as whole with
/// a broken last object: the first sync must not wait for ever on a typo.
#[tokio::test]
async fn a_file_cut_off_at_start_and_left_so_is_the_complete_list_after_the_wait() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(Some(B_CUT))).expect("write");
    let (mut rx, health, task) = watch(&path);
    let first = events_within(&mut rx, Duration::from_secs(2)).await;
    assert!(
        first.iter().all(|e| matches!(e, Event::Apply(_))),
        "{first:?}"
    );
    let later = events_within(&mut rx, FIRST_LIST_WAIT + Duration::from_secs(3)).await;
    match later.as_slice() {
        [Event::Replace { kinds, objects }] => {
            assert_eq!(kinds.len(), 4);
            assert_eq!(objects.len(), 2, "a, and b rejected: {objects:?}");
        }
        other => panic!("expected the complete list after the wait, got {other:?}"),
    }
    assert_eq!(problems_of(&health), [], "{:?}", problems_of(&health));
    task.abort();
}

/// A restart on a file cut off at a line break (a writer that writes line by line, stopped
/// after `b`'s `ports:`): the text ends with a line break, but its last object lacks what
/// the writer had not written yet. Held as the mid-line cut is; the input problem names the
/// file, the object and where it is, and the bound.
#[tokio::test]
async fn a_file_cut_off_at_a_line_break_at_start_is_held_naming_where() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, three_services(Some("10.96.0.2\n  ports:\n"))).expect("write");
    let (mut rx, health, task) = watch(&path);
    match (next(&mut rx).await, next(&mut rx).await) {
        (Some(Event::Apply(Object::Service(a))), Some(Event::Apply(Object::Rejected(b)))) => {
            assert_eq!((&*a.key.name, &*b.object.name), ("a", "b"));
        }
        other => panic!("expected a applied and b rejected, one by one, got {other:?}"),
    }
    let problems = first_problems(&health).await;
    let [(what, message)] = problems.as_slice() else {
        panic!("{problems:?}")
    };
    assert_eq!(what, &path.to_string_lossy());
    for said in [
        "the first sync waits",
        "looks cut off mid-write",
        "Service ns/b",
        "document 2 (line 11)",
        "lacks spec.ports",
        &format!("at most {FIRST_LIST_WAIT:?}"),
    ] {
        assert!(message.contains(said), "{said:?} in {message}");
    }
    std::fs::write(&path, three_services(None)).expect("write");
    match next(&mut rx).await {
        Some(Event::Replace { objects, .. }) => assert_eq!(objects.len(), 3),
        other => panic!("expected the complete list once the file is whole, got {other:?}"),
    }
    assert_eq!(problems_of(&health), [], "the file is whole");
    task.abort();
}

/// A start on a file whose last object is written wrong on purpose (valid YAML, a field out of
/// range, of the wrong type, an unknown protocol, as the CLI and e2e tests and operators
/// write): that is not a cut-off file, and its first load is the complete
/// list at once (the first event, before any `Apply`), not after [`FIRST_LIST_WAIT`].
#[tokio::test]
async fn a_last_object_written_wrong_at_start_is_the_complete_list_at_once() {
    let whole = three_services(None);
    // (case, text)
    let cases = [
        (
            "c's port out of range",
            format!(
                "{}port: 99999\n    protocol: TCP\n",
                &whole[..whole.rfind("port: 80").expect("c's port")]
            ),
        ),
        (
            "c's port of the wrong type",
            format!(
                "{}port: eighty\n    protocol: TCP\n",
                &whole[..whole.rfind("port: 80").expect("c's port")]
            ),
        ),
        (
            "c's protocol unknown",
            format!(
                "{}port: 80\n    protocol: TCPX\n",
                &whole[..whole.rfind("port: 80").expect("c's port")]
            ),
        ),
    ];
    for (case, text) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, text).expect("write");
        let (mut rx, health, task) = watch(&path);
        let first = tokio::time::timeout(FIRST_LIST_WAIT / 2, rx.recv()).await;
        match first {
            Ok(Some(Event::Replace { objects, .. })) => {
                assert_eq!(objects.len(), 3, "{case}");
                assert!(
                    matches!(objects.last(), Some(Object::Rejected(c)) if &*c.object.name == "c"),
                    "{case}: {objects:?}"
                );
            }
            other => panic!("{case}: expected the complete list first, got {other:?}"),
        }
        assert!(
            problems_of(&health)
                .iter()
                .all(|(_, m)| !m.contains("first sync")),
            "{case}: {:?}",
            problems_of(&health)
        );
        task.abort();
    }
}
