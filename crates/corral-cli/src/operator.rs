//! `corral operator`: a replica of the cluster operator in the foreground, on the settings
//! `operator_config.rs` resolves (flags, environment, `--config` file), until SIGINT or
//! SIGTERM.

use std::sync::Arc;
use std::time::Duration;

use crate::cloud::Providers;
use crate::cluster::{connect, log_tls_reloads};
use crate::exit::{Failure, Outcome};
use crate::operator_config::OperatorArgs;

/// Runs a replica of the operator until SIGINT or SIGTERM.
pub fn run(args: OperatorArgs, providers: &Providers) -> Result<Outcome, Failure> {
    // Everything the flags, the environment and the file give is checked before the log
    // starts and before anything else.
    let operator = crate::operator_config::resolve(&args)?;
    crate::logging::install(operator.log_format, operator.log_level)?;
    let (api, etcd, cloud_args, settings) = (
        operator.api,
        operator.etcd,
        operator.cloud,
        operator.settings,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("corral-operator")
        .build()
        .map_err(Failure::Runtime)?;
    // The signals are caught from here on, whatever the replica is doing (connecting,
    // campaigning, waiting for `cluster init`, leading, etcd unreachable): each wait selects
    // on `stopped`.
    let signal = {
        let _runtime = runtime.enter();
        corral_agent::shutdown_signal().map_err(Failure::Runtime)?
    };
    runtime.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            signal.await;
            let _ = stop_tx.send(true);
        });
        let stopped = move || {
            let mut stop_rx = stop_rx.clone();
            async move {
                let _ = stop_rx.wait_for(|stop| *stop).await;
            }
        };
        let started = async {
            // The cloud first: a cloud the build lacks, or bad settings, is refused before
            // etcd.
            let cloud = cloud_args.connect(providers).await?;
            let (kv, _) = connect(&etcd).await?;
            log_tls_reloads(&kv);
            Ok::<_, Failure>((cloud, kv))
        };
        let (cloud, kv) = tokio::select! {
            biased;
            () = stopped() => return Ok(Outcome::ok(String::new())),
            started = started => started?,
        };
        let replica = settings.replica.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        });
        let shared = Arc::new(corral_operator::Shared::new(replica.clone()));
        let epoch_file = settings
            .state_dir
            .as_ref()
            .map(|dir| corral_operator::epoch::epoch_file(dir, etcd.cluster_name()));
        if epoch_file.is_none() {
            tracing::warn!(
                "no --state-dir: the highest etcd revision seen is remembered in memory only \
                 (the agents remember it durably; a new term waits for their holdings)"
            );
        }
        shared
            .configure_epoch(epoch_file, settings.settle)
            .map_err(Failure::Usage)?;
        let config = corral_operator::OperatorConfig {
            cluster: etcd.cluster_name().to_owned(),
            replica,
            lease_ttl: settings.lease_ttl.max(Duration::from_secs(1)),
            workers: settings.workers,
            page: corral_operator::OperatorConfig::DEFAULT_PAGE,
            max_txn_ops: settings.max_txn_ops,
        };
        let api = corral_operator::api::bind(api, Arc::clone(&shared))
            .await
            .map_err(|e| Failure::Operator(e.into()))?;
        let api_socket = settings.api_socket.display().to_string();
        match api.tcp_addr() {
            Some(tcp) => tracing::info!(
                api_socket,
                %tcp,
                dashboard = %format_args!("http://{tcp}/dashboard"),
                "serving the api (tcp: bearer token)"
            ),
            None => tracing::info!(api_socket, "serving the api"),
        }
        tracing::info!(
            replica = %config.replica,
            etcd = %etcd.etcd.join(","),
            "campaigning"
        );
        let shutdown = Box::pin(stopped());
        match cloud {
            Some(cloud) => {
                let run = crate::cloud::OperatorRun {
                    kv,
                    config,
                    shared,
                    shutdown,
                };
                cloud.run_operator(run).await
            }
            None => corral_operator::run(kv, config, shared, shutdown).await,
        }
        .map_err(|e| Failure::Operator(e.into()))?;
        api.stop().await;
        Ok(Outcome::ok(String::new()))
    })
}
