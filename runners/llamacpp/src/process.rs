//! Running one llama.cpp tool defensively: a cleaned environment (no `LLAMA_*`, `GGML_*`,
//! OpenMP or other variables that silently change results or what the tools print), the
//! tool's own directory on `LD_LIBRARY_PATH` (CMake builds load `libllama.so`/`libggml*.so`
//! from there), stdin closed, stdout and stderr drained on their own threads (so a chatty
//! tool never blocks on a full pipe), the tool in its own process group, which a timeout or
//! an interrupt ([`interrupt_flag`]) kills whole (a `killpg` system call, no `kill`
//! binary), errors that carry the stderr tail, and the tool's peak resident memory (its
//! `VmHWM`, read while it runs).
//!
//! No tool outlives the program that started it: on Linux every tool gets a parent-death
//! signal (`PR_SET_PDEATHSIG` = SIGKILL, set between fork and exec), so even a SIGKILL of
//! the caller takes the tool down; and [`kill_running`] kills the process group of every
//! tool still running, for a program that must exit at once (a second Ctrl-C).

use crate::error::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Writes `text` to `path` as an executable file (mode 755) without this process ever
/// holding `path` open for writing. A file descriptor open for writing is inherited by
/// every child another thread forks meanwhile, and until that child execs, running `path`
/// fails with "Text file busy" (`ETXTBSY`); test suites that write fake tools while other
/// tests spawn processes hit exactly that. So the text goes to `path.part` (never run),
/// a `cp` subprocess copies it to `path`, and `path.part` is removed.
pub fn write_executable(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    std::fs::write(&part, text)?;
    let status = Command::new("cp")
        .arg("--")
        .arg(&part)
        .arg(path)
        .stdin(Stdio::null())
        .status()?;
    std::fs::remove_file(&part)?;
    if !status.success() {
        return Err(std::io::Error::other(format!(
            "cp {} {} failed: {status}",
            part.display(),
            path.display()
        )));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

/// Lines of stderr kept in errors.
pub const STDERR_TAIL_LINES: usize = 20;

/// Prefixes of environment variables removed before every tool runs. llama.cpp's tools
/// read these (found by grepping `getenv` in llama.cpp's common/, src/, ggml/src/ and
/// tools/, build b-0.3.36 era, and common/arg.cpp's `set_env`):
/// - `LLAMA_` — every `LLAMA_ARG_*` overrides a command-line default (context, batch,
///   threads, flash attention, KV types) and the `LLAMA_ARG_LOG_*` ones change what the log
///   prints (verbosity, prefixes, timestamps, colors, a log file, JSONL); besides those,
///   `LLAMA_ATTN_ROT_DISABLE` and `LLAMA_GRAPH_REUSE_DISABLE` change numerics or speed,
///   `LLAMA_TRACE` and the `LLAMA_*_DEBUG` switches flood the output the parsers read,
///   `LLAMA_CACHE` moves downloads.
/// - `GGML_` — `GGML_CPU_DISABLE_FUSION`, `GGML_CPU_TILED_MM(_FORCE)` change the CPU
///   kernels, `GGML_BACKEND_PATH` loads another backend, `GGML_SCHED_DEBUG*`,
///   `GGML_META_DEBUG` print, `GGML_TOTAL_THREADS` sets threads (KleidiAI), and the
///   GPU-backend variables have no business in a CPU measurement.
/// - `OMP_`, `GOMP_`, `KMP_` — the CPU backend is built with OpenMP (libgomp) by default:
///   `OMP_THREAD_LIMIT` and `OMP_DYNAMIC` can lower the thread count `-t` asked for,
///   `OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`, `KMP_BLOCKTIME`, `OMP_PROC_BIND`, `OMP_PLACES`
///   and `GOMP_CPU_AFFINITY` change speed.
/// - `MTMD_`, `LLAMACPP_` — multimodal and test switches (`MTMD_DEBUG_*`,
///   `LLAMACPP_TEST_MODELFILE`).
pub const REMOVED_ENV_PREFIXES: &[&str] = &[
    "LLAMA_",
    "GGML_",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MTMD_",
    "LLAMACPP_",
];

/// Single environment variables removed before every tool runs, besides
/// [`REMOVED_ENV_PREFIXES`]: download endpoints and tokens (llama-bench and common/ read
/// them for `-hf`; a measurement never downloads, and a secret has no reason to reach the
/// tool), llguidance's log level, and `NO_COLOR` (the tools' logs go to a pipe, where
/// colors are off anyway; cleared so the log format never depends on the caller).
pub const REMOVED_ENV_VARS: &[&str] = &[
    "HF_TOKEN",
    "HUGGINGFACE_HUB_TOKEN",
    "HF_ENDPOINT",
    "MODEL_ENDPOINT",
    "LLGUIDANCE_LOG_LEVEL",
    "NO_COLOR",
];

static INTERRUPT: LazyLock<Arc<AtomicBool>> = LazyLock::new(Arc::default);

/// The process-wide stop request every [`run`] polls (with the exit and timeout checks,
/// every 20 ms): once set, the running tool's process group is killed and `run` returns
/// [`Error::Interrupted`]; later runs are killed as soon as they start. A program sets it
/// from its SIGINT/SIGTERM handler (e.g. `signal_hook::flag::register`).
pub fn interrupt_flag() -> Arc<AtomicBool> {
    Arc::clone(&INTERRUPT)
}

fn interrupted() -> bool {
    INTERRUPT.load(Ordering::SeqCst)
}

/// Whether an environment variable is removed before a tool runs.
pub fn is_removed_env_var(name: &OsStr) -> bool {
    let name = name.to_string_lossy();
    REMOVED_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
        || REMOVED_ENV_VARS.contains(&name.as_ref())
}

/// The names (never the values) of the variables in this process's environment that every
/// tool run has removed, sorted: what a report says was cleared.
pub fn cleared_env_vars() -> Vec<String> {
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| is_removed_env_var(k))
        .map(|k| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One invocation of a tool.
#[derive(Debug, Clone)]
pub struct ToolCommand {
    /// Name used in messages, e.g. `llama-perplexity`.
    pub tool: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub timeout: Duration,
    /// What to tell the user when the tool fails.
    pub hint: String,
    /// Variables set for the tool (after the cleaning).
    pub env: Vec<(OsString, OsString)>,
}

impl ToolCommand {
    pub fn new(tool: &str, program: &Path, timeout: Duration, hint: &str) -> Self {
        Self {
            tool: tool.to_string(),
            program: program.to_path_buf(),
            args: Vec::new(),
            timeout,
            hint: hint.to_string(),
            env: Vec::new(),
        }
    }

    pub fn arg(&mut self, a: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(a.as_ref().to_os_string());
        self
    }

    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        for a in args {
            self.arg(a);
        }
        self
    }

    /// The command as a shell-like line, for reports and error messages.
    pub fn display(&self) -> String {
        let mut s = shell_quote(self.program.as_os_str());
        for a in &self.args {
            s.push(' ');
            s.push_str(&shell_quote(a));
        }
        s
    }

    /// The `std::process::Command` this runs, with the environment cleaned.
    pub fn to_command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, _) in std::env::vars_os() {
            if is_removed_env_var(&k) {
                cmd.env_remove(&k);
            }
        }
        if let Some(dir) = self.program.parent().filter(|d| !d.as_os_str().is_empty()) {
            let mut paths = vec![dir.to_path_buf()];
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            if let Ok(joined) = std::env::join_paths(paths) {
                cmd.env("LD_LIBRARY_PATH", joined);
            }
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Own process group, so a timeout can kill the tool and anything it started.
            cmd.process_group(0);
        }
        #[cfg(target_os = "linux")]
        die_with_parent(&mut cmd);
        cmd
    }
}

/// Makes the child get SIGKILL when this process dies, however it dies (`prctl(
/// PR_SET_PDEATHSIG)`, kept across `exec`). The signal fires when the *thread* that forked
/// the child ends; [`run`] waits for its tool on the thread that spawned it, so that thread
/// outlives the tool. If this process died between `fork` and the `prctl` call, the child
/// has already been re-parented and no signal would ever come: it then checks its parent
/// is still the process that started it, and otherwise fails before `exec` (the tool never
/// runs).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = rustix::process::getpid();
    let hook = move || -> std::io::Result<()> {
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        if rustix::process::getppid() != Some(parent) {
            // The parent is gone: no such process (ESRCH), without allocating.
            return Err(rustix::io::Errno::SRCH.into());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before `exec`, where only async-signal-safe
    // work is allowed: it makes two raw system calls through rustix (`prctl`, `getppid`),
    // and its errors are raw OS error codes; it allocates nothing and takes no lock, and
    // it touches no memory shared with the parent (`parent` is a copied integer).
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// Process groups of the tools running now (each tool leads its own), for [`kill_running`].
static RUNNING: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn running() -> std::sync::MutexGuard<'static, Vec<i32>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Kills (SIGKILL) the process group of every tool [`run`] is running now. For a program
/// about to exit at once (a second interrupt): the groups die with it instead of running on
/// under PID 1. Safe to call from any thread; `run` itself then sees its tool killed.
pub fn kill_running() {
    #[cfg(unix)]
    for &pgid in running().iter() {
        if let Some(pid) = rustix::process::Pid::from_raw(pgid) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Removes the tool's group from [`RUNNING`] once it has been reaped, however `run` ends.
struct Registered(i32);

impl Registered {
    fn new(child: &Child) -> Registered {
        let pgid = i32::try_from(child.id()).unwrap_or(0);
        running().push(pgid);
        Registered(pgid)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        running().retain(|&p| p != self.0);
    }
}

fn shell_quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// What a tool printed, once it exited.
#[derive(Debug, Clone)]
pub struct ToolOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    /// The command line that ran.
    pub command: String,
    /// The tool's peak resident set size in bytes: its own high-water mark (`VmHWM` in
    /// /proc/PID/status, Linux), the largest read at the polls while it ran, so growth in its
    /// final poll interval (20 ms) is missed; the tool's own children are not counted.
    /// `None` where /proc is not readable.
    pub max_rss_bytes: Option<u64>,
}

impl ToolOutput {
    pub fn stderr_tail(&self) -> String {
        tail_lines(&self.stderr, STDERR_TAIL_LINES)
    }
}

/// The last `n` lines of `text`.
pub fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    lines[start..].join("\n")
}

type SharedBuf = Arc<Mutex<Vec<u8>>>;

fn drain<R: Read + Send + 'static>(mut reader: R, buf: SharedBuf) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => buf
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    })
}

fn snapshot(buf: &SharedBuf) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

fn kill_tree(child: &mut Child) {
    #[cfg(unix)]
    {
        // The child leads its own process group (process_group(0)); kill the group so a
        // wrapper script's children die too and release the pipes.
        let pid = rustix::process::Pid::from_child(child);
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
    let _ = child.kill();
}

/// A process's resident high-water mark in bytes (`VmHWM` of /proc/PID/status); `None`
/// when it cannot be read (not Linux, or the process has exited).
pub fn vm_hwm_bytes(pid: &str) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

/// A process's resident size now in bytes (`VmRSS` of /proc/PID/status); `None` when it
/// cannot be read.
pub fn vm_rss_bytes(pid: &str) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// One `kB` field of /proc/PID/status, in bytes.
fn status_bytes(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line
        .trim_start_matches(field)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// How often the process is polled for exit, timeout and stdout progress.
const POLL: Duration = Duration::from_millis(20);
/// How long to wait for the pipes to close after the process exited (a leftover grandchild
/// may hold them open).
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Runs `cmd` to completion. `on_output(stdout, stderr)` is called (on this thread) with
/// everything printed so far whenever either grew, for progress. A non-zero exit is an [`Error::Failed`] with the
/// stderr tail and `cmd.hint`; a timeout kills the process group and is an
/// [`Error::Timeout`].
pub fn run(cmd: &ToolCommand, mut on_output: impl FnMut(&str, &str)) -> Result<ToolOutput> {
    let command = cmd.display();
    let start = Instant::now();
    let mut child = cmd.to_command().spawn().map_err(|source| Error::Spawn {
        path: cmd.program.clone(),
        source,
    })?;
    // Unregistered when `run` returns, or once the loop below has reaped the child.
    let registered = Registered::new(&child);
    let out_buf: SharedBuf = Arc::default();
    let err_buf: SharedBuf = Arc::default();
    let mut drains = Vec::new();
    if let Some(out) = child.stdout.take() {
        drains.push(drain(out, out_buf.clone()));
    }
    if let Some(err) = child.stderr.take() {
        drains.push(drain(err, err_buf.clone()));
    }

    let mut seen = (0usize, 0usize);
    let lens = || {
        (
            out_buf.lock().unwrap_or_else(|e| e.into_inner()).len(),
            err_buf.lock().unwrap_or_else(|e| e.into_inner()).len(),
        )
    };
    let pid = child.id().to_string();
    let mut max_rss_bytes = None;
    let status = loop {
        // Read before reaping: a reaped child has no /proc entry. The largest reading, in
        // case the tool resets its own mark.
        if let Some(b) = vm_hwm_bytes(&pid) {
            max_rss_bytes = max_rss_bytes.max(Some(b));
        }
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(source) => {
                kill_tree(&mut child);
                return Err(Error::Spawn {
                    path: cmd.program.clone(),
                    source,
                });
            }
        }
        if interrupted() {
            kill_tree(&mut child);
            let _ = child.wait();
            wait_for_drains(&drains, PIPE_GRACE);
            return Err(Error::Interrupted {
                tool: cmd.tool.clone(),
                command,
            });
        }
        if start.elapsed() >= cmd.timeout {
            kill_tree(&mut child);
            let _ = child.wait();
            wait_for_drains(&drains, PIPE_GRACE);
            return Err(Error::Timeout {
                tool: cmd.tool.clone(),
                after: cmd.timeout,
                command,
                stderr_tail: tail_lines(&snapshot(&err_buf), STDERR_TAIL_LINES),
            });
        }
        let now = lens();
        if now != seen {
            seen = now;
            on_output(&snapshot(&out_buf), &snapshot(&err_buf));
        }
        std::thread::sleep(POLL);
    };
    drop(registered);
    let elapsed = start.elapsed();
    if !wait_for_drains(&drains, PIPE_GRACE) {
        // Something still holds the pipes (a grandchild); take what we have.
        kill_tree(&mut child);
    }
    let output = ToolOutput {
        status,
        stdout: snapshot(&out_buf),
        stderr: snapshot(&err_buf),
        elapsed,
        command,
        max_rss_bytes,
    };
    if (output.stdout.len(), output.stderr.len()) != seen {
        on_output(&output.stdout, &output.stderr);
    }
    if !status.success() {
        return Err(Error::Failed {
            tool: cmd.tool.clone(),
            status: describe_status(&status),
            command: output.command.clone(),
            stderr_tail: output.stderr_tail(),
            hint: cmd.hint.clone(),
        });
    }
    Ok(output)
}

fn wait_for_drains(drains: &[JoinHandle<()>], grace: Duration) -> bool {
    let until = Instant::now() + grace;
    while Instant::now() < until {
        if drains.iter().all(|d| d.is_finished()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    drains.iter().all(|d| d.is_finished())
}

fn describe_status(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            let name = match sig {
                4 => " (SIGILL: the binary uses CPU instructions this machine lacks)",
                6 => " (SIGABRT: an assertion failed)",
                9 => " (SIGKILL: killed, perhaps out of memory)",
                11 => " (SIGSEGV)",
                _ => "",
            };
            return format!("killed by signal {sig}{name}");
        }
    }
    format!("{status}")
}
