//! What the tests against moto share: the `moto_server` child process (with EC2's rules for
//! the private addresses it picks: `moto_server.py`) and the VPC, subnet and instance they run
//! in.

use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use corral_aws::{Ec2, Timeouts};

/// A `moto_server` child process on a free port of 127.0.0.1, killed (by its PID) on drop.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Moto {
    /// `$MOTO_SERVER`, else `target/moto-venv/bin/moto_server` under the workspace root.
    pub fn binary() -> PathBuf {
        if let Some(path) = std::env::var_os("MOTO_SERVER") {
            return PathBuf::from(path);
        }
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/moto-venv/bin/moto_server")
    }

    /// The Python that runs moto: the interpreter of `moto_server`'s script (its `#!` line).
    fn python(binary: &Path) -> PathBuf {
        let script = std::fs::read_to_string(binary).unwrap_or_default();
        let interpreter = script
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("#!"))
            .map(str::trim)
            .filter(|path| path.contains("python"));
        PathBuf::from(interpreter.unwrap_or_else(|| {
            panic!(
                "{} is not moto's Python script (its first line names no python)",
                binary.display()
            )
        }))
    }

    /// Starts moto_server through `moto_server.py` beside this file, which makes moto pick
    /// private addresses as EC2 does (never a subnet's five reserved addresses, never one
    /// handed out already): moto's own picks put the subnet's gateway on an interface in
    /// about one run in twenty-five, and corral rightly refuses to serve it.
    pub fn start() -> Moto {
        let binary = Moto::binary();
        assert!(
            binary.exists(),
            "moto_server not found at {} (run `make deps`, or set MOTO_SERVER)",
            binary.display()
        );
        let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/moto_server.py");
        // A port free when asked, outside the ephemeral range; moto binds it a moment later.
        let port = corral_etcd::testing::free_ports(1).expect("a free port on 127.0.0.1")[0];
        let child = Command::new(Moto::python(&binary))
            .arg(&wrapper)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("starting {}: {error}", binary.display()));
        let mut moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        moto.wait_until_it_answers(port);
        moto
    }

    fn wait_until_it_answers(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("moto_server's status") {
                panic!("moto_server exited before answering: {status}");
            }
            if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not listen on port {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn provider(&self) -> Ec2 {
        Ec2::with_endpoint(
            &self.endpoint,
            "us-east-1",
            "testing",
            "testing",
            Timeouts::default(),
        )
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        // SIGKILL: moto can be busy in a request (it loops forever on an exhausted subnet).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Creates a VPC on `vpc_cidr` with one subnet on `subnet_cidr`; returns the subnet's id.
pub async fn create_subnet(ec2: &Ec2, vpc_cidr: &str, subnet_cidr: &str) -> String {
    let client = ec2.client();
    let vpc_id = client
        .create_vpc()
        .cidr_block(vpc_cidr)
        .send()
        .await
        .expect("CreateVpc")
        .vpc()
        .and_then(|vpc| vpc.vpc_id())
        .expect("a vpc id")
        .to_owned();
    client
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block(subnet_cidr)
        .send()
        .await
        .expect("CreateSubnet")
        .subnet()
        .and_then(|subnet| subnet.subnet_id())
        .expect("a subnet id")
        .to_owned()
}

/// Creates the VPC, subnet and instance; returns the subnet and instance ids.
pub async fn create_fixture(ec2: &Ec2, instance_type: &str) -> (String, String) {
    let client = ec2.client();
    let subnet_id = create_subnet(ec2, "10.0.0.0/16", "10.0.0.0/24").await;
    let image_id = client
        .describe_images()
        .send()
        .await
        .expect("DescribeImages")
        .images()
        .first()
        .and_then(|image| image.image_id())
        .expect("moto ships images")
        .to_owned();
    let instance_id = client
        .run_instances()
        .image_id(image_id)
        .instance_type(instance_type.into())
        // The primary interface spelled out with EC2's default (moto's default is the opposite).
        .network_interfaces(
            aws_sdk_ec2::types::InstanceNetworkInterfaceSpecification::builder()
                .device_index(0)
                .subnet_id(&subnet_id)
                .delete_on_termination(true)
                .build(),
        )
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .expect("RunInstances")
        .instances()
        .first()
        .and_then(|instance| instance.instance_id())
        .expect("an instance id")
        .to_owned();
    (subnet_id, instance_id)
}
