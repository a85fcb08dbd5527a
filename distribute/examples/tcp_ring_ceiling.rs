//! What a ring all-reduce over loopback TCP can reach on this machine, whatever the
//! protocol on top: N processes, each with one connection to its right neighbour, the ring
//! all-reduce of `ferroflow-distribute` (reduce-scatter then all-gather, 1 MiB segments,
//! pipelined), with nothing but `write_all` / `read_exact` and one copy to send. The
//! `BENCHMARKS.md` figures compare the gRPC ring and Open MPI with it.
//!
//! Usage: `tcp_ring_ceiling RANKS SIZES_MIB` (e.g. `tcp_ring_ceiling 4 1,4,16,64`): starts
//! the ranks as child processes of itself on loopback ports the OS picked and prints, per
//! size, rank 0's median of 5 all-reduces as bus bandwidth (`2(n-1)/n` × bytes / s).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const SEGMENT_BYTES: usize = 1 << 20;
const REPEATS: usize = 5;

/// Kills the ranks it holds when dropped (also when the parent fails).
struct Ranks(Vec<Child>);

impl Drop for Ranks {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("rank") => rank(&args[2..]),
        Some(n) => parent(n.parse()?, args.get(2).ok_or("missing SIZES_MIB")?),
        None => Err("usage: tcp_ring_ceiling RANKS SIZES_MIB".into()),
    }
}

/// Starts the ranks: each binds its listener, prints its port, and learns its neighbour's.
fn parent(n: usize, sizes: &str) -> Result<()> {
    if n < 2 {
        return Err("RANKS must be at least 2".into());
    }
    let exe = std::env::current_exe()?;
    let mut ranks = Ranks(vec![]);
    let mut ports = vec![];
    for r in 0..n {
        let mut child = Command::new(&exe)
            .args(["rank", &r.to_string(), &n.to_string(), sizes])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let port: u16 = lines.next().ok_or("a rank ended early")??.trim().parse()?;
        ports.push(port);
        ranks.0.push(child);
        if r == 0 {
            // Rank 0 prints the results: pass them on.
            std::thread::spawn(move || {
                for line in lines.map_while(|l| l.ok()) {
                    println!("{line}");
                }
            });
        }
    }
    for (r, child) in ranks.0.iter_mut().enumerate() {
        let right = ports[(r + 1) % n];
        writeln!(child.stdin.as_mut().ok_or("no stdin")?, "{right}")?;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    for child in &mut ranks.0 {
        loop {
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    return Err(format!("a rank failed: {status}").into());
                }
                break;
            }
            if Instant::now() > deadline {
                return Err("the ranks took more than 600 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn rank(args: &[String]) -> Result<()> {
    let [r, n, sizes] = args else {
        return Err("rank R N SIZES".into());
    };
    let (r, n): (usize, usize) = (r.parse()?, n.parse()?);
    let listener = TcpListener::bind("127.0.0.1:0")?;
    println!("{}", listener.local_addr()?.port());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let right_port: u16 = line.trim().parse()?;
    let right = TcpStream::connect(("127.0.0.1", right_port))?;
    right.set_nodelay(true)?;
    let (mut left, _) = listener.accept()?;
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    let mut writer = right.try_clone()?;
    let sending = std::thread::spawn(move || -> std::io::Result<()> {
        for segment in rx {
            writer.write_all(&segment)?;
        }
        Ok(())
    });
    for mib in sizes.split(',') {
        let mib: usize = mib.trim().parse()?;
        let len = (mib << 20) / 4;
        let mut data = vec![1.0f32; len];
        let mut times = vec![];
        for repeat in 0..REPEATS {
            let start = Instant::now();
            all_reduce(r, n, &mut data, &tx, &mut left)?;
            times.push(start.elapsed().as_secs_f64());
            // Every value is the sum over the ranks: n after the first.
            if repeat == 0 && data.iter().any(|&v| v != n as f32) {
                return Err(format!("rank {r}: the all-reduce of {mib} MiB summed wrong").into());
            }
        }
        times.sort_by(f64::total_cmp);
        let bytes = (mib << 20) as f64;
        let bus = 2.0 * (n - 1) as f64 / n as f64 * bytes / times[REPEATS / 2] / 1e9;
        if r == 0 {
            println!("{mib} MiB: bus {bus:.2} GB/s (median of {REPEATS})");
        }
    }
    drop(tx);
    sending
        .join()
        .map_err(|_| "the sending thread panicked")??;
    Ok(())
}

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// The ring all-reduce of `data`, chunked and pipelined like the gRPC ring.
fn all_reduce(
    r: usize,
    n: usize,
    data: &mut [f32],
    tx: &mpsc::Sender<Vec<u8>>,
    left: &mut TcpStream,
) -> Result<()> {
    let bounds: Vec<usize> = (0..=n).map(|i| i * data.len() / n).collect();
    let per = SEGMENT_BYTES / 4;
    let segments = |c: usize| {
        let (s, e) = (bounds[c], bounds[c + 1]);
        (0..(e - s).div_ceil(per)).map(move |j| (s + j * per)..(s + (j + 1) * per).min(e))
    };
    let mut buf = vec![0u8; SEGMENT_BYTES];
    for range in segments(r) {
        tx.send(bytes_of(&data[range]))?;
    }
    for step in 0..n - 1 {
        for range in segments((r + 2 * n - step - 1) % n) {
            let got = &mut buf[..range.len() * 4];
            left.read_exact(got)?;
            for (d, g) in data[range.clone()].iter_mut().zip(got.chunks_exact(4)) {
                *d += f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
            }
            tx.send(bytes_of(&data[range]))?;
        }
    }
    for step in 0..n - 1 {
        for range in segments((r + n - step) % n) {
            let got = &mut buf[..range.len() * 4];
            left.read_exact(got)?;
            for (d, g) in data[range.clone()].iter_mut().zip(got.chunks_exact(4)) {
                *d = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
            }
            if step + 1 < n - 1 {
                tx.send(bytes_of(&data[range]))?;
            }
        }
    }
    Ok(())
}
