//! Ports a launcher hands to a task (`hand_over`, `bind_listener`), across a real `exec`:
//! this test binary starts itself again running the ignored `task` test (or, through
//! `LocalCluster`, `foreign_task`: a program that binds its address itself).

#![cfg(unix)]

use ferroflow_cluster::{bind_listener, hand_over, reserve_loopback_ports, LISTEN_FDS_ENV};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the child on drop (a failing assertion included).
struct Task(Child);

impl Drop for Task {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn task_command(address: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        "task",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("HANDED_PORT_ADDRESS", address)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    c
}

/// The first line the task printed (at most 60 s).
fn first_line(task: &mut Task) -> String {
    let out = task.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            // libtest may print "test task ... " on the same line first.
            if let Some(at) = line.find("task: ") {
                let _ = tx.send(line[at..].to_string());
                return;
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the task said nothing in 60 s")
}

/// What the task at `address` answers a connection with (read for at most 30 s).
fn reply_from(address: &str) -> String {
    let mut s = std::net::TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    reply
}

/// What `command` names in [`LISTEN_FDS_ENV`] (`address=fd,..`).
fn named_ports(command: &Command) -> String {
    command
        .get_envs()
        .find(|(k, _)| *k == LISTEN_FDS_ENV)
        .and_then(|(_, v)| v)
        .and_then(|v| v.to_str())
        .expect("hand_over named the ports")
        .to_string()
}

/// The child: listens where it is told (through `bind_listener`), says how that went, and
/// answers one connection with "hello".
#[test]
#[ignore = "run by the tests below as a child process"]
fn task() {
    let address = std::env::var("HANDED_PORT_ADDRESS").unwrap();
    match bind_listener(&address) {
        Err(e) => println!("task: cannot listen: {e}"),
        Ok(listener) => {
            listener.set_nonblocking(false).unwrap();
            println!("task: listening on {}", listener.local_addr().unwrap());
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(b"hello").unwrap();
        }
    }
}

#[test]
fn a_task_serves_on_the_socket_its_launcher_holds() {
    let ports = reserve_loopback_ports(1).unwrap();
    let address = ports[0].address().to_string();
    let mut command = task_command(&address);
    hand_over(&mut command, &[&ports[0]]);
    let mut task = Task(command.spawn().unwrap());
    // The launcher still holds the port listening: the task could not have bound it anew.
    let said = first_line(&mut task);
    assert_eq!(said, format!("task: listening on {address}"));
    drop(ports);
    assert_eq!(reply_from(&address), "hello");
}

#[test]
fn ports_handed_over_by_two_calls_are_both_named() {
    let ports = reserve_loopback_ports(2).unwrap();
    // The task serves on the second port; the first call's port stays named beside it.
    let mut command = task_command(ports[1].address());
    hand_over(&mut command, &[&ports[0]]);
    hand_over(&mut command, &[&ports[1]]);
    let named = named_ports(&command);
    assert_eq!(named.split(',').count(), 2, "{named}");
    assert!(
        named.starts_with(&format!("{}=", ports[0].address())),
        "{named}"
    );
    let mut task = Task(command.spawn().unwrap());
    let said = first_line(&mut task);
    assert_eq!(said, format!("task: listening on {}", ports[1].address()));
    let address = ports[1].address().to_string();
    drop(ports);
    assert_eq!(reply_from(&address), "hello");
}

#[test]
fn without_a_handed_socket_the_task_binds_and_a_held_port_is_in_use() {
    let ports = reserve_loopback_ports(1).unwrap();
    let mut task = Task(task_command(ports[0].address()).spawn().unwrap());
    let said = first_line(&mut task);
    assert!(said.starts_with("task: cannot listen"), "{said}");
}

#[test]
fn a_descriptor_named_for_another_address_is_not_taken() {
    let ports = reserve_loopback_ports(2).unwrap();
    let mut command = task_command(ports[1].address());
    hand_over(&mut command, &[&ports[0]]);
    // Name port 0's descriptor as port 1's: the task must see it is not that socket.
    let named = named_ports(&command);
    let fd = named.rsplit_once('=').unwrap().1;
    command.env(LISTEN_FDS_ENV, format!("{}={fd}", ports[1].address()));
    let mut task = Task(command.spawn().unwrap());
    // Port 1 is still held here: binding it anew fails, and that is what the task reports.
    let said = first_line(&mut task);
    assert!(said.starts_with("task: cannot listen"), "{said}");
}

/// A program that binds its `TF_CONFIG` address itself, as TensorFlow does (no
/// `bind_listener`): says whether it could.
#[test]
#[ignore = "run by the tests below as a child process"]
fn foreign_task() {
    let Ok(tf_config) = std::env::var("TF_CONFIG") else {
        return;
    };
    let config: serde_json::Value = serde_json::from_str(&tf_config).unwrap();
    let index = config["task"]["index"].as_u64().unwrap() as usize;
    let address = config["cluster"]["worker"][index].as_str().unwrap();
    match std::net::TcpListener::bind(address) {
        Ok(_) => println!("task: bound {address}"),
        Err(e) => println!("task: cannot bind {address}: {e}"),
    }
}

/// What each task of a `ferroflow launch`-style job of 2 foreign tasks said.
fn foreign_job(release_ports: bool) -> Vec<String> {
    let spec = ferroflow_cluster::LaunchSpec {
        workers: 2,
        program: std::env::current_exe().unwrap().to_string_lossy().into(),
        args: ["--ignored", "--exact", "foreign_task", "--nocapture"]
            .map(String::from)
            .to_vec(),
        release_ports,
        ..Default::default()
    };
    let mut job = ferroflow_cluster::LocalCluster::start(&spec).unwrap();
    job.wait(Some(Duration::from_secs(60))).unwrap();
    (0..2).map(|i| job.output(i)).collect()
}

#[test]
fn release_ports_lets_a_program_bind_its_tf_config_address_itself() {
    for out in foreign_job(true) {
        assert!(out.contains("task: bound 127.0.0.1:"), "{out}");
    }
    // Handed over listening (the default), the port is the task's socket already: a
    // program that binds anew finds it in use.
    for out in foreign_job(false) {
        assert!(out.contains("task: cannot bind"), "{out}");
    }
}
