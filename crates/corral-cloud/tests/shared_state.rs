//! `FakeEc2::shared_state`: fakes that keep their resources in one state file are one cloud —
//! what one creates the others see (after the same consistency lag and attachment delay), ids
//! and addresses are never handed out twice, a fake started later (a failover's new leader)
//! finds everything, and a state file of another seed or one that does not decode is refused
//! naming it. On tokio's paused clock, as the other fake tests.

use crate::common;

use common::subnet;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use corral_cloud::fake::InstanceSpec;
use corral_cloud::{
    Amount, AttachInterface, AttachmentStatus, CloudError, CloudProvider, CreateInterface, FakeEc2,
    InterfaceFilter,
};

/// A fresh state file path (removed with its lock and temporary file at the end).
struct StatePath(PathBuf);

impl StatePath {
    fn new() -> StatePath {
        static N: AtomicU32 = AtomicU32::new(0);
        StatePath(std::env::temp_dir().join(format!(
            "corral-fake-state-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }
}

impl Drop for StatePath {
    fn drop(&mut self) {
        for suffix in ["", ".lock", ".tmp"] {
            let mut path = self.0.as_os_str().to_owned();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The same seed, as each replica builds it.
fn fake(path: &StatePath, fingerprint: &str) -> Result<FakeEc2, CloudError> {
    FakeEc2::builder()
        .seed(5)
        .subnet(subnet("subnet-a", "vpc-1", "us-east-1a", "10.0.0.0/24"))
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-a"))
        .instance(InstanceSpec::new("m5.large", "subnet-a").id("i-b"))
        .build()
        .unwrap()
        .shared_state(&path.0, fingerprint)
}

fn create(count: u32) -> CreateInterface {
    CreateInterface {
        subnet_id: "subnet-a".into(),
        secondary_ipv4: Some(Amount::Count(count)),
        ..CreateInterface::default()
    }
}

#[tokio::test(start_paused = true)]
async fn fakes_on_one_state_file_are_one_cloud_that_outlives_each() {
    let path = StatePath::new();
    let a = fake(&path, "seed-1").unwrap();
    let b = fake(&path, "seed-1").unwrap();
    let first = a.create_interface(&create(2)).await.unwrap();
    // The other fake made the next one: another id, other addresses.
    let second = b.create_interface(&create(2)).await.unwrap();
    assert_ne!(first.id, second.id);
    for address in &second.secondary_ipv4 {
        assert!(
            !first.secondary_ipv4.contains(address) && first.primary_ipv4 != *address,
            "{address} handed out twice"
        );
    }
    // Each sees the other's once the consistency lag (at most 5 s) passed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let ids = |list: Vec<corral_cloud::NetworkInterface>| -> Vec<String> {
        list.into_iter().map(|ni| ni.id).collect()
    };
    let seen_by_b = ids(b
        .describe_interfaces(&InterfaceFilter::default())
        .await
        .unwrap());
    assert!(seen_by_b.contains(&first.id), "{seen_by_b:?}");
    // An attachment made through one completes for the other 1–8 s later, not at once.
    a.attach_interface(AttachInterface::new(&second.id, "i-b", 1))
        .await
        .unwrap();
    let status = |fake: &FakeEc2| {
        fake.interface(&second.id)
            .and_then(|ni| ni.attachment)
            .map(|a| a.status)
    };
    assert_eq!(status(&b), Some(AttachmentStatus::Attaching));
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert_eq!(status(&b), Some(AttachmentStatus::Attached));
    // Both gone (a failover): the next fake finds everything, and goes on numbering.
    drop(a);
    drop(b);
    let c = fake(&path, "seed-1").unwrap();
    let seen = ids(c.interfaces());
    assert!(
        seen.contains(&first.id) && seen.contains(&second.id),
        "{seen:?}"
    );
    let third = c.create_interface(&create(1)).await.unwrap();
    assert!(third.id != first.id && third.id != second.id);
    // A client token's first answer is kept across fakes too.
    let mut token = create(1);
    token.client_token = Some("intent-1".into());
    let made = c.create_interface(&token).await.unwrap();
    let d = fake(&path, "seed-1").unwrap();
    assert_eq!(d.create_interface(&token).await.unwrap().id, made.id);
}

#[tokio::test(start_paused = true)]
async fn a_state_file_of_another_seed_or_unreadable_is_refused_naming_it() {
    let path = StatePath::new();
    fake(&path, "seed-1").unwrap();
    let error = fake(&path, "seed-2").unwrap_err().to_string();
    assert!(
        error.contains(&path.0.display().to_string()) && error.contains("another seed"),
        "{error}"
    );
    std::fs::write(&path.0, "garbage").unwrap();
    let error = fake(&path, "seed-1").unwrap_err().to_string();
    assert!(
        error.contains(&path.0.display().to_string()) && error.contains("decoding"),
        "{error}"
    );
}

/// A process stopped while holding the lock (SIGSTOP mid-call) does not hang the others: their
/// calls fail with `InternalError` naming the lock after a while, change nothing, and go
/// through again once it is free.
#[tokio::test(start_paused = true)]
async fn a_lock_held_too_long_fails_the_call_instead_of_hanging() {
    let path = StatePath::new();
    let a = fake(&path, "seed-1").unwrap();
    let mut lock_path = path.0.as_os_str().to_owned();
    lock_path.push(".lock");
    let held = std::fs::OpenOptions::new()
        .write(true)
        .open(&lock_path)
        .unwrap();
    held.lock().unwrap();
    let before = a.interfaces().len();
    let error = a.create_interface(&create(1)).await.unwrap_err();
    assert!(
        matches!(error, CloudError::InternalError { .. }) && error.to_string().contains("locking"),
        "{error}"
    );
    held.unlock().unwrap();
    assert_eq!(a.interfaces().len(), before);
    a.create_interface(&create(1)).await.unwrap();
    assert_eq!(a.interfaces().len(), before + 1);
}
