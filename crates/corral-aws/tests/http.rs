//! The adapter against endpoints that fail as networks do, played by plain sockets on
//! 127.0.0.1: no answer in time, no listener, an HTML error page, EC2's throttling answer.
//! These need no moto: they check the error mapping through the SDK's real HTTP stack.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::thread::JoinHandle;
use std::time::Duration;

use corral_aws::{Ec2, Timeouts};
use corral_cloud::{
    Action, Amount, AttachInterface, CloudError, CloudProvider, InterfaceFilter, Ipv4Assign,
};

fn provider(port: u16, operation: Duration) -> Ec2 {
    Ec2::with_endpoint(
        &format!("http://127.0.0.1:{port}"),
        "us-east-1",
        "testing",
        "testing",
        Timeouts {
            connect: Duration::from_secs(2),
            operation,
        },
    )
}

/// A server that answers one request with `answer` (None: reads it and never answers, until
/// the client gives up and closes).
fn serve_once(answer: Option<String>) -> (u16, JoinHandle<()>) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 4096];
        // Read the head and the body (the SDK sends a Content-Length).
        loop {
            let n = stream.read(&mut buffer).unwrap_or(0);
            if n == 0 {
                return;
            }
            request.extend_from_slice(&buffer[..n]);
            let text = String::from_utf8_lossy(&request);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break;
                }
            }
        }
        match answer {
            Some(answer) => {
                let _ = stream.write_all(answer.as_bytes());
            }
            // Hold the connection open until the client closes it.
            None => while stream.read(&mut buffer).map(|n| n > 0).unwrap_or(false) {},
        }
    });
    (port, handle)
}

/// A provider (5 s per operation) whose endpoint answers its one request with `status` and
/// `body`; the server's thread.
fn answering(status: &str, content_type: &str, body: &str) -> (Ec2, JoinHandle<()>) {
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (port, server) = serve_once(Some(answer));
    (provider(port, Duration::from_secs(5)), server)
}

/// [`answering`] with EC2's XML error answer of `code` and `message`.
fn answering_error(status: &str, code: &str, message: &str) -> (Ec2, JoinHandle<()>) {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>r-1</RequestID></Response>"
    );
    answering(status, "text/xml", &body)
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_timeout() {
    let (port, server) = serve_once(None);
    let ec2 = provider(port, Duration::from_millis(300));
    let error = ec2
        .describe_interfaces(&InterfaceFilter::id("eni-1"))
        .await
        .unwrap_err();
    assert_eq!(
        error,
        CloudError::Timeout {
            action: Action::DescribeNetworkInterfaces
        }
    );
    assert!(error.is_ambiguous() && !error.is_retryable());
    drop(ec2);
    server.join().unwrap();
}

#[tokio::test]
async fn no_listener_is_a_timeout_as_the_call_may_not_have_been_sent() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ec2 = provider(port, Duration::from_secs(5));
    assert_eq!(
        ec2.delete_interface("eni-1").await,
        Err(CloudError::Timeout {
            action: Action::DeleteNetworkInterface
        })
    );
}

#[tokio::test]
async fn an_html_error_page_is_an_internal_error() {
    let page = "<!doctype html><title>500 Internal Server Error</title>";
    let (ec2, server) = answering("500 Internal Server Error", "text/html", page);
    let error = ec2.delete_interface("eni-1").await.unwrap_err();
    assert!(
        matches!(error, CloudError::InternalError { .. }),
        "{error:?}"
    );
    assert!(error.is_ambiguous() && !error.is_retryable());
    server.join().unwrap();
}

#[tokio::test]
async fn ec2s_throttling_answer_is_request_limit_exceeded() {
    let (ec2, server) = answering_error(
        "503 Service Unavailable",
        "RequestLimitExceeded",
        "Request limit exceeded.",
    );
    let one_address = Ipv4Assign::Addresses(Amount::Count(1));
    let error = ec2.assign_ipv4("eni-1", &one_address).await.unwrap_err();
    assert_eq!(
        error,
        CloudError::RequestLimitExceeded {
            action: Action::AssignPrivateIpAddresses
        }
    );
    server.join().unwrap();
}

#[tokio::test]
async fn an_occupied_device_index_from_the_wire_is_device_index_in_use() {
    let (ec2, server) = answering_error(
        "400 Bad Request",
        "InvalidParameterValue",
        "Instance 'i-0123' already has an interface attached at device index '1'.",
    );
    let error = ec2
        .attach_interface(AttachInterface::new("eni-1", "i-0123", 1))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, CloudError::DeviceIndexInUse { message } if message.contains("device index '1'")),
        "{error:?}"
    );
    server.join().unwrap();
}
