//! The TCP server and load of `bench/streams.sh`.
//!
//! `stream_bench server PORT`: each connection's first byte says what it wants: `U` (upload:
//! read to EOF, then answer the byte count as 8 bytes), `D` + 8 bytes N (download: N bytes,
//! then close), `E` (echo to EOF).
//! `stream_bench upload ADDR BYTES` / `download ADDR BYTES`: one connection, prints MiB/s.
//! `stream_bench conns ADDR SECONDS CONCURRENCY`: new connections for that long, each an echo
//! of 32 bytes and a close; prints connections/s.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHUNK: usize = 256 * 1024;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => server(args[1].parse().unwrap()).await,
        Some("upload") => {
            let n: u64 = args[2].parse().unwrap();
            let t = Instant::now();
            let mut s = TcpStream::connect(&args[1]).await.unwrap();
            s.write_all(b"U").await.unwrap();
            let buf = vec![1u8; CHUNK];
            let mut left = n;
            while left > 0 {
                let k = left.min(CHUNK as u64) as usize;
                s.write_all(&buf[..k]).await.unwrap();
                left -= k as u64;
            }
            s.shutdown().await.unwrap();
            let got = s.read_u64().await.unwrap();
            assert_eq!(got, n, "the server got {got} of {n} bytes");
            report(n, t.elapsed());
        }
        Some("download") => {
            let n: u64 = args[2].parse().unwrap();
            let t = Instant::now();
            let mut s = TcpStream::connect(&args[1]).await.unwrap();
            s.write_all(b"D").await.unwrap();
            s.write_u64(n).await.unwrap();
            let mut buf = vec![0u8; CHUNK];
            let mut got = 0u64;
            loop {
                let k = s.read(&mut buf).await.unwrap();
                if k == 0 {
                    break;
                }
                got += k as u64;
            }
            assert_eq!(got, n, "got {got} of {n} bytes");
            report(n, t.elapsed());
        }
        Some("conns") => {
            let addr = args[1].clone();
            let secs: u64 = args[2].parse().unwrap();
            let c: usize = args[3].parse().unwrap();
            let until = Instant::now() + Duration::from_secs(secs);
            let t = Instant::now();
            let tasks: Vec<_> = (0..c)
                .map(|_| {
                    let addr = addr.clone();
                    tokio::spawn(async move {
                        let (mut ok, mut failed) = (0u64, 0u64);
                        while Instant::now() < until {
                            match echo_once(&addr).await {
                                Ok(()) => ok += 1,
                                Err(_) => failed += 1,
                            }
                        }
                        (ok, failed)
                    })
                })
                .collect();
            let (mut ok, mut failed) = (0, 0);
            for task in tasks {
                let (o, f) = task.await.unwrap();
                ok += o;
                failed += f;
            }
            let el = t.elapsed().as_secs_f64();
            println!(
                "{:.0} connections/s ({ok} ok, {failed} failed)",
                ok as f64 / el
            );
        }
        _ => eprintln!(
            "usage: stream_bench server PORT | upload|download ADDR BYTES | conns ADDR SECONDS C"
        ),
    }
}

fn report(n: u64, el: Duration) {
    println!(
        "{:.0} MiB/s ({} MiB in {:.3} s)",
        n as f64 / (1 << 20) as f64 / el.as_secs_f64(),
        n >> 20,
        el.as_secs_f64()
    );
}

async fn echo_once(addr: &str) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(b"E0123456789abcdef0123456789abcdef").await?;
    s.shutdown().await?;
    let mut back = Vec::with_capacity(32);
    s.read_to_end(&mut back).await?;
    if back.len() != 32 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

async fn server(port: u16) {
    let l = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    loop {
        let Ok((mut s, _)) = l.accept().await else {
            continue;
        };
        let _ = s.set_nodelay(true);
        tokio::spawn(async move {
            let mut kind = [0u8; 1];
            if s.read_exact(&mut kind).await.is_err() {
                return;
            }
            let mut buf = vec![0u8; CHUNK];
            match kind[0] {
                b'U' => {
                    let mut got = 0u64;
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => got += k as u64,
                        }
                    }
                    let _ = s.write_u64(got).await;
                    let _ = s.shutdown().await;
                }
                b'D' => {
                    let Ok(n) = s.read_u64().await else { return };
                    let mut left = n;
                    while left > 0 {
                        let k = left.min(CHUNK as u64) as usize;
                        if s.write_all(&buf[..k]).await.is_err() {
                            return;
                        }
                        left -= k as u64;
                    }
                    let _ = s.shutdown().await;
                }
                _ => {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                }
            }
        });
    }
}
