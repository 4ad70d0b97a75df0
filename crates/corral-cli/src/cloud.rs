//! The clouds a build of the command line knows, for `--cloud NAME` (`corral operator`,
//! `corral cluster check`): the seam between the CLI and cloud providers.
//!
//! Every build knows `fake` (corral-cloud's in-process `FakeEc2`, seeded from `--fake-cloud
//! FILE`, its state kept in `FILE.state` under a lock, so every process given the file shares
//! one cloud). A provider that links a large SDK lives in its own crate with its own binary, which
//! calls [`crate::main_with`] with [`Providers::builtin`] plus its own entry
//! ([`Providers::with`]): corral-aws's `corral-aws` adds `aws`. Asking the plain `corral` for a
//! cloud it does not know is a usage error that names the build that has it.
//!
//! A provider is any [`CloudProvider`]; the CLI reaches it through [`Cloud`], a trait object
//! ([`CloudProvider`]'s methods are generic futures, not object-safe) with the two things the
//! command line does with a cloud: run the operator's cloud node manager on it, and list every
//! interface of the account for the check.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use corral_cloud::{CloudError, CloudProvider, InterfaceFilter, NetworkInterface};

use crate::exit::Failure;

/// A boxed future that can run on a multi-threaded runtime.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the command line was given for the cloud, beside its name.
#[derive(Clone, Debug, Default)]
pub struct CloudSettings {
    /// `--cloud-endpoint`: the cloud API's URL instead of the provider's default (a VPC
    /// endpoint, or a local emulator such as moto).
    pub endpoint: Option<String>,
    /// `--fake-cloud`: the fake cloud's seed file.
    pub fake_cloud: Option<PathBuf>,
}

/// What the operator runs the cloud node manager with (besides the provider).
pub struct OperatorRun {
    pub kv: corral_etcd::EtcdKv,
    pub config: corral_operator::OperatorConfig,
    pub shared: Arc<corral_operator::Shared>,
    pub shutdown: BoxFuture<'static, ()>,
}

impl std::fmt::Debug for OperatorRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorRun")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A connected cloud, as the command line uses it. Implemented for every [`CloudProvider`].
pub trait Cloud: Send + Sync {
    /// Runs a replica of the operator with this cloud's node manager, until `run.shutdown`.
    fn run_operator(
        self: Arc<Self>,
        run: OperatorRun,
    ) -> BoxFuture<'static, Result<(), corral_operator::OperatorError>>;

    /// Every network interface of the account (DescribeNetworkInterfaces without a filter,
    /// every page): read-only.
    fn interfaces(&self) -> BoxFuture<'_, Result<Vec<NetworkInterface>, CloudError>>;
}

impl<P: CloudProvider + 'static> Cloud for P {
    fn run_operator(
        self: Arc<Self>,
        run: OperatorRun,
    ) -> BoxFuture<'static, Result<(), corral_operator::OperatorError>> {
        Box::pin(async move {
            let options = corral_operator::CloudOptions::new(self);
            corral_operator::run_with_cloud(
                run.kv,
                run.config,
                run.shared,
                Some(options),
                run.shutdown,
            )
            .await
        })
    }

    fn interfaces(&self) -> BoxFuture<'_, Result<Vec<NetworkInterface>, CloudError>> {
        Box::pin(async move { self.describe_interfaces(&InterfaceFilter::default()).await })
    }
}

/// Connects a provider from the settings (a usage problem, or a cloud that cannot be reached,
/// as a message).
type Connect =
    Box<dyn Fn(CloudSettings) -> BoxFuture<'static, Result<Arc<dyn Cloud>, String>> + Send + Sync>;

struct Entry {
    name: &'static str,
    connect: Connect,
}

/// Clouds known elsewhere: the build to use for them.
const OTHER_BUILDS: &[(&str, &str)] = &[(
    "aws",
    "the AWS build of corral: the `corral-aws` binary (`cargo build --release -p corral-aws`), \
     the same command line with the AWS SDK linked in",
)];

/// The clouds of one build, by `--cloud` name.
pub struct Providers {
    entries: Vec<Entry>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("names", &self.names())
            .finish()
    }
}

impl Providers {
    /// What every build knows: `fake`, corral-cloud's in-process fake EC2, seeded from
    /// `--fake-cloud FILE` (a demo and test backend).
    pub fn builtin() -> Providers {
        Providers {
            entries: Vec::new(),
        }
        .with("fake", |settings: CloudSettings| async move {
            // The fake runs in-process: an endpoint given for it would be silently unused.
            if let Some(endpoint) = &settings.endpoint {
                return Err(format!(
                    "--cloud-endpoint {endpoint} does not apply (the fake cloud runs in-process)"
                ));
            }
            let path = settings.fake_cloud.ok_or_else(|| {
                "--cloud fake needs --fake-cloud FILE (the fake cloud's seed)".to_owned()
            })?;
            fake_cloud(&path)
        })
    }

    /// Adds the cloud `name`: `connect` builds its provider from the settings (a problem as a
    /// message: a usage error).
    pub fn with<F, Fut, P>(mut self, name: &'static str, connect: F) -> Providers
    where
        F: Fn(CloudSettings) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<P, String>> + Send + 'static,
        P: CloudProvider + 'static,
    {
        self.entries.retain(|e| e.name != name);
        self.entries.push(Entry {
            name,
            connect: Box::new(move |settings| {
                let connecting = connect(settings);
                Box::pin(async move {
                    let provider = connecting.await?;
                    Ok(Arc::new(provider) as Arc<dyn Cloud>)
                })
            }),
        });
        self
    }

    /// The names this build knows.
    pub fn names(&self) -> Vec<&'static str> {
        self.entries.iter().map(|e| e.name).collect()
    }

    /// Connects the cloud `name`: an unknown name, or settings the provider refuses, is a
    /// usage error (naming the build that has the cloud, if another does).
    pub async fn connect(
        &self,
        name: &str,
        settings: CloudSettings,
    ) -> Result<Arc<dyn Cloud>, Failure> {
        if settings.fake_cloud.is_some() && name != "fake" {
            return Err(Failure::Usage(format!(
                "--fake-cloud is for --cloud fake, not --cloud {name}"
            )));
        }
        let Some(entry) = self.entries.iter().find(|e| e.name == name) else {
            let known = self.names().join(", ");
            return Err(Failure::Usage(
                match OTHER_BUILDS.iter().find(|(other, _)| *other == name) {
                    Some((_, build)) => format!(
                        "--cloud {name}: this build of corral knows {known}; {name} needs {build}"
                    ),
                    None => format!("--cloud {name}: unknown cloud (this build knows {known})"),
                },
            ));
        };
        (entry.connect)(settings)
            .await
            .map_err(|e| Failure::Usage(format!("--cloud {name}: {e}")))
    }
}

/// The cloud's view of its interfaces as the check compares it with the records: each
/// interface's attachment and its secondary addresses and delegated prefixes, both families
/// (the primary address is the interface's own, never in a record).
pub fn cloud_truth(interfaces: Vec<NetworkInterface>) -> corral_cluster::CloudTruth {
    interfaces
        .into_iter()
        .map(|ni| {
            let attached = ni.attachment.as_ref().map(|a| a.instance_id.clone());
            let nets = ni.secondary_nets().into_iter().collect();
            (ni.id, (attached, nets))
        })
        .collect::<BTreeMap<_, _>>()
}

/// The fake cloud's seed file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeCloudFile {
    #[serde(default)]
    seed: u64,
    subnets: Vec<FakeSubnet>,
    #[serde(default)]
    instances: Vec<FakeInstance>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FakeSubnet {
    id: String,
    vpc: String,
    zone: String,
    ipv4: String,
    /// The subnet's IPv6 /64, if it has one.
    #[serde(default)]
    ipv6: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
struct FakeInstance {
    id: String,
    #[serde(rename = "type")]
    instance_type: String,
    subnet: String,
    /// IPv4 /28 prefixes delegated to its primary interface at start.
    #[serde(default)]
    ipv4_prefixes: u32,
    /// IPv6 /80 prefixes delegated to its primary interface at start.
    #[serde(default)]
    ipv6_prefixes: u32,
}

/// Where the fake cloud of the seed file `seed` keeps its state: `SEED.state` beside it (and
/// its lock, `SEED.state.lock`).
pub fn fake_cloud_state(seed: &Path) -> PathBuf {
    let mut path = seed.as_os_str().to_owned();
    path.push(".state");
    PathBuf::from(path)
}

/// Builds the fake EC2 of `--fake-cloud`; a file that does not read or parse is a problem
/// naming it. Its resources live in [`fake_cloud_state`] (created from the seed if absent),
/// shared by every process of the machine given the same seed file: the replicas of `corral
/// operator` and `corral cluster check` see one cloud, and a failover finds it as the last
/// leader left it.
fn fake_cloud(path: &Path) -> Result<corral_cloud::FakeEc2, String> {
    let bad = |problem: String| format!("{}: {problem}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let file: FakeCloudFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut builder = corral_cloud::FakeEc2::builder().seed(file.seed);
    for subnet in &file.subnets {
        let cidr = subnet
            .ipv4
            .parse()
            .map_err(|e| bad(format!("subnet {}: {e}", subnet.id)))?;
        let mut spec =
            corral_cloud::fake::SubnetSpec::new(&subnet.id, &subnet.vpc, &subnet.zone, cidr);
        if let Some(ipv6) = &subnet.ipv6 {
            let cidr = ipv6
                .parse()
                .map_err(|e| bad(format!("subnet {}: {e}", subnet.id)))?;
            spec = spec.ipv6(cidr);
        }
        builder = builder.subnet(spec);
    }
    for instance in &file.instances {
        builder = builder.instance(
            corral_cloud::fake::InstanceSpec::new(&instance.instance_type, &instance.subnet)
                .id(&instance.id),
        );
    }
    let fake = builder.build().map_err(|e| bad(e.to_string()))?;
    for instance in &file.instances {
        if instance.ipv4_prefixes > 0 || instance.ipv6_prefixes > 0 {
            fake.delegate_to_primary(&instance.id, instance.ipv4_prefixes, instance.ipv6_prefixes)
                .map_err(|e| bad(format!("instance {}: {e}", instance.id)))?;
        }
    }
    fake.shared_state(&fake_cloud_state(path), &text)
        .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--cloud-endpoint` with the fake cloud is a usage error naming the option, not ignored.
    #[tokio::test]
    async fn an_endpoint_for_the_fake_cloud_is_a_usage_error() {
        let settings = CloudSettings {
            endpoint: Some("http://127.0.0.1:5000".to_owned()),
            fake_cloud: Some(PathBuf::from("/nonexistent/fake-cloud.json")),
        };
        match Providers::builtin().connect("fake", settings).await {
            Err(Failure::Usage(message)) => {
                assert!(message.contains("--cloud-endpoint"), "{message}")
            }
            Err(other) => panic!("not a usage error: {other:?}"),
            Ok(_) => panic!("an endpoint for the fake cloud was accepted"),
        }
    }
}
