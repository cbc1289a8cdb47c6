//! `countersign-review`: the reviewer terminal UI (DESIGN.md section 9).
//!
//! # Layout
//! - `app.rs`: the state and all key handling (`App::event`), no I/O.
//! - `ui.rs`: drawing, read-only over `App`.
//! - `net.rs`: the live connection to `/v1` and the commands, signed with
//!   the reviewer's key through `countersign::cli::client`.
//!
//! The terminal is restored on exit and on panic (`ratatui::init` installs
//! the hook).

mod app;
mod net;
mod ui;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use tokio::sync::mpsc;

use app::{App, Input};

/// Review and approve countersign proposals in the terminal.
#[derive(Parser)]
#[command(name = "countersign-review", version, about)]
struct Args {
    /// Gateway base URL.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7373",
        env = "COUNTERSIGN_GATEWAY"
    )]
    gateway: String,
    /// The reviewer's key file (from `countersign keygen`).
    #[arg(long, env = "COUNTERSIGN_KEY")]
    key: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // Fail before touching the terminal: a bad key file is a plain error.
    let key = match countersign::cli::client::load_key(&args.key) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("countersign-review: {e:#}");
            return ExitCode::from(2);
        }
    };
    let client = match countersign::cli::client::Client::new(&args.gateway, &key) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("countersign-review: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("countersign-review: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut terminal = ratatui::init();
    let result = runtime.block_on(run(&mut terminal, client, &args.gateway, &key.name));
    ratatui::restore();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("countersign-review: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(
    terminal: &mut ratatui::DefaultTerminal,
    client: Arc<countersign::cli::client::Client>,
    gateway: &str,
    reviewer: &str,
) -> anyhow::Result<()> {
    let mut app = App::new(reviewer, gateway, countersign::core::time::now_ms());
    let (input_tx, mut input_rx) = mpsc::channel::<Input>(256);
    let (net_tx, mut net_rx) = mpsc::channel(256);
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    tokio::spawn(net::follow(client.clone(), net_tx.clone()));
    tokio::spawn(net::perform(client, cmd_rx, net_tx));
    // Keys come from a blocking reader thread; resizes just redraw.
    let keys = input_tx.clone();
    std::thread::spawn(move || loop {
        match event::read() {
            Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                if keys.blocking_send(Input::Key(k)).is_err() {
                    return;
                }
            }
            Ok(Event::Resize(..)) => {
                if keys
                    .blocking_send(Input::Tick(countersign::core::time::now_ms()))
                    .is_err()
                {
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    });
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        terminal.draw(|f| ui::draw(&app, f))?;
        let input = tokio::select! {
            Some(i) = input_rx.recv() => i,
            Some(n) = net_rx.recv() => Input::Net(n),
            _ = tick.tick() => Input::Tick(countersign::core::time::now_ms()),
        };
        for cmd in app.event(input) {
            cmd_tx.send(cmd).await?;
        }
        if app.quit {
            return Ok(());
        }
    }
}
