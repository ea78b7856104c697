//! Communicators through the C API: made from the launcher's environment, from a unique id
//! passed out of band, or from a store the caller provides; split, duplicated, aborted and
//! destroyed.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::{guard, invalid, xcclResult_t, xcclSuccess};
use crate::bootstrap::{Auth, KeyValue, Rendezvous, StoreServer, group};
use crate::comm::Communicator;
use crate::config::Config;
use crate::error::{Error, Result};

/// A communicator (opaque).
pub struct xcclComm {
    pub(crate) comm: Communicator,
    /// The store this process serves for the ranks of a unique id, kept while the
    /// communicator lives.
    _store: Option<StoreServer>,
}

/// A handle on a communicator.
pub type xcclComm_t = *mut xcclComm;

/// Bytes of an [`xcclUniqueId`].
pub const XCCL_UNIQUE_ID_BYTES: usize = 256;

/// Where the ranks of a communicator meet, made by one process ([`xcclGetUniqueId`]) and
/// passed to every rank out of band (MPI, a file, a socket): the address of a store that
/// process serves and the job's secret. Treat it as a secret.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct xcclUniqueId {
    /// The id, as text ending in a NUL byte.
    pub internal: [c_char; XCCL_UNIQUE_ID_BYTES],
}

/// `color` of [`xcclCommSplit`] for a rank that joins no new communicator.
pub const XCCL_SPLIT_NOCOLOR: c_int = -1;

/// A key-value store the caller provides (PyTorch's `c10d::Store`, a shared file system, a
/// database): three callbacks on `ctx`, each returning 0 on success and non-zero on failure.
/// Every rank of a communicator uses the same store; no other communicator may use its keys
/// (give each one its own prefix). xccl calls the callbacks only during
/// [`xcclCommInitStore`], possibly from another thread than the caller's.
#[repr(C)]
pub struct xcclStore {
    /// Passed to every callback.
    pub ctx: *mut c_void,
    /// Sets `key` (NUL-terminated) to the `len` bytes at `value`.
    pub set: Option<
        unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, value: *const u8, len: usize) -> c_int,
    >,
    /// Waits until `key` is set, then stores in `*value` a buffer allocated with `malloc`
    /// holding its bytes (xccl frees it) and their number in `*len`.
    pub get: Option<
        unsafe extern "C" fn(
            ctx: *mut c_void,
            key: *const c_char,
            value: *mut *mut u8,
            len: *mut usize,
        ) -> c_int,
    >,
    /// Adds `delta` to the integer at `key` (0 if unset) and stores the new value in `*result`.
    pub add: Option<
        unsafe extern "C" fn(ctx: *mut c_void, key: *const c_char, delta: i64, result: *mut i64) -> c_int,
    >,
}

/// The caller's store as xccl's [`KeyValue`].
struct CStore<'a> {
    store: &'a xcclStore,
}

// SAFETY: the store is borrowed for the duration of xcclCommInitStore only; its documented
// contract allows calling the callbacks from any thread during that call.
unsafe impl Send for CStore<'_> {}

impl CStore<'_> {
    fn key(key: &str) -> Result<std::ffi::CString> {
        std::ffi::CString::new(key)
            .map_err(|_| Error::Internal(format!("store key '{key}' holds a NUL byte")))
    }

    fn failed(what: &str, key: &str, rc: c_int) -> Error {
        Error::Bootstrap(format!("the store's {what} callback failed on key '{key}' (returned {rc})"))
    }
}

impl KeyValue for CStore<'_> {
    fn set(&mut self, key: &str, value: &[u8]) -> Result<()> {
        let f = self.store.set.ok_or_else(|| Error::Internal("store without set".into()))?;
        let k = Self::key(key)?;
        // SAFETY: the caller of xcclCommInitStore promised a callback that reads `len` bytes at
        // `value` and a NUL-terminated key, both valid for the call.
        let rc = unsafe { f(self.store.ctx, k.as_ptr(), value.as_ptr(), value.len()) };
        if rc != 0 { Err(Self::failed("set", key, rc)) } else { Ok(()) }
    }

    fn get(&mut self, key: &str) -> Result<Vec<u8>> {
        let f = self.store.get.ok_or_else(|| Error::Internal("store without get".into()))?;
        let k = Self::key(key)?;
        let (mut ptr, mut len) = (std::ptr::null_mut::<u8>(), 0usize);
        // SAFETY: as for `set`; the callback stores a malloc'd buffer and its length.
        let rc = unsafe { f(self.store.ctx, k.as_ptr(), &mut ptr, &mut len) };
        if rc != 0 {
            return Err(Self::failed("get", key, rc));
        }
        if ptr.is_null() {
            return if len == 0 { Ok(Vec::new()) } else { Err(Self::failed("get (NULL value)", key, rc)) };
        }
        // SAFETY: the callback's contract: `ptr` holds `len` bytes allocated with malloc, now
        // ours; they are copied, then freed once.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec();
        // SAFETY: `ptr` came from malloc (the callback's contract) and is freed only here.
        unsafe { libc::free(ptr.cast()) };
        Ok(bytes)
    }

    fn add(&mut self, key: &str, delta: i64) -> Result<i64> {
        let f = self.store.add.ok_or_else(|| Error::Internal("store without add".into()))?;
        let k = Self::key(key)?;
        let mut out = 0i64;
        // SAFETY: as for `set`; the callback writes one i64.
        let rc = unsafe { f(self.store.ctx, k.as_ptr(), delta, &mut out) };
        if rc != 0 { Err(Self::failed("add", key, rc)) } else { Ok(out) }
    }
}

/// Stores a new handle for `comm` in `out`.
fn give(out: *mut xcclComm_t, comm: Communicator, store: Option<StoreServer>) -> Result<()> {
    // SAFETY: callers checked `out` is not NULL; it points to a handle the caller owns.
    unsafe { *out = Box::into_raw(Box::new(xcclComm { comm, _store: store })) };
    Ok(())
}

/// The communicator behind a handle.
pub(crate) fn comm_ref<'a>(api: &'static str, comm: xcclComm_t) -> Result<&'a Communicator> {
    // SAFETY: a non-NULL handle came from this library and was not destroyed (the caller's
    // contract for every function taking an xcclComm_t).
    unsafe { comm.as_ref() }.map(|c| &c.comm).ok_or_else(|| invalid(api, "comm is NULL"))
}

fn out_ok<T>(api: &'static str, what: &str, out: *mut T) -> Result<()> {
    if out.is_null() { Err(invalid(api, format!("{what} is NULL"))) } else { Ok(()) }
}

fn rank_size(api: &'static str, nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    let size = usize::try_from(nranks).ok().filter(|&n| n > 0);
    let size = size.ok_or_else(|| invalid(api, format!("nranks is {nranks}; it must be at least 1")))?;
    let rank = usize::try_from(rank).ok().filter(|&r| r < size);
    let rank = rank.ok_or_else(|| invalid(api, format!("rank is outside 0..{size} (nranks)")))?;
    Ok((rank, size))
}

/// Makes this process's rank of the job its launcher started (`xccl run`, torchrun, Slurm's
/// srun, mpirun, or `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT` set by hand), as the
/// Rust `Communicator::from_env`. Collective over the job.
///
/// # Safety
/// `comm` points to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommInitFromEnv(comm: *mut xcclComm_t) -> xcclResult_t {
    guard(|| {
        out_ok("xcclCommInitFromEnv", "comm", comm)?;
        give(comm, Communicator::from_env()?, None)
    })
}

/// Ids this process made and serves the store of, until a communicator of this process
/// takes its store over.
static SERVED: Mutex<Vec<(String, StoreServer)>> = Mutex::new(Vec::new());

const ID_MAGIC: &str = "xccl-id1";

fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| Error::Config(format!("no randomness for a unique id: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Makes a unique id for a new communicator: this process starts serving a small store on
/// the address its host name resolves to (the one other hosts reach it at), protected by a
/// secret drawn here. Pass the id to every rank (for example `MPI_Bcast` of its bytes) and
/// call [`xcclCommInitRank`] on each. The store stops when this process's communicator of
/// that id is destroyed, or when the process ends.
///
/// # Safety
/// `id` points to an `xcclUniqueId` to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclGetUniqueId(id: *mut xcclUniqueId) -> xcclResult_t {
    guard(|| {
        out_ok("xcclGetUniqueId", "id", id)?;
        let job = format!("uid-{}", random_hex(12)?);
        let secret = random_hex(32)?;
        let auth = Auth::new(job.clone(), secret.clone().into_bytes())?;
        let ip = group::listen_ip(None)?;
        let server = StoreServer::start((ip, 0), auth.clone())?;
        let text = format!("{ID_MAGIC} {} {job} {secret}", server.addr());
        let mut raw = [0 as c_char; XCCL_UNIQUE_ID_BYTES];
        if text.len() >= XCCL_UNIQUE_ID_BYTES {
            return Err(Error::Internal(format!("unique id of {} bytes", text.len())));
        }
        for (d, s) in raw.iter_mut().zip(text.bytes()) {
            *d = s as c_char;
        }
        SERVED.lock().unwrap_or_else(PoisonError::into_inner).push((job, server));
        // SAFETY: checked non-NULL; the caller's pointer to an id.
        unsafe { (*id).internal = raw };
        Ok(())
    })
}

/// Makes rank `rank` of `nranks` of the communicator of `id` ([`xcclGetUniqueId`]).
/// Collective over the `nranks` ranks.
///
/// # Safety
/// `comm` points to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommInitRank(
    comm: *mut xcclComm_t,
    nranks: c_int,
    id: xcclUniqueId,
    rank: c_int,
) -> xcclResult_t {
    const API: &str = "xcclCommInitRank";
    guard(|| {
        out_ok(API, "comm", comm)?;
        let (rank, size) = rank_size(API, nranks, rank)?;
        let bytes: Vec<u8> = id.internal.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let bad = || invalid(API, "id is not an xcclUniqueId made by xcclGetUniqueId");
        let mut parts = text.split(' ');
        if parts.next() != Some(ID_MAGIC) {
            return Err(bad());
        }
        let (addr, job, secret) =
            (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
        addr.parse::<SocketAddr>().map_err(|_| bad())?;
        let config = Config::from_env()?;
        let rv = Rendezvous {
            store: addr.to_string(),
            serve_store: false,
            c10d_prefix: None,
            launcher: "unique id",
            ..Rendezvous::for_store(rank, size, Auth::new(job, secret.as_bytes().to_vec())?, config.timeout)?
        };
        let c = Communicator::connect(&rv, config)?;
        let store = {
            let mut served = SERVED.lock().unwrap_or_else(PoisonError::into_inner);
            served.iter().position(|(j, _)| j == job).map(|i| served.remove(i).1)
        };
        give(comm, c, store)
    })
}

/// Makes rank `rank` of `nranks` of a communicator whose ranks meet in `store` (see
/// [`xcclStore`]); this rank listens for its peers on the address it uses on the way to
/// `storeHost` (the host every rank reaches the store at; NULL or "": the address its host
/// name resolves to). `timeoutSeconds` bounds the wait for the others and, unless
/// `XCCL_TIMEOUT` is set, each operation's wait for progress (0: `XCCL_TIMEOUT` or its default).
/// Links prove `XCCL_SECRET` where it is set, else a secret rank 0 draws and shares through
/// the store. Collective over the `nranks` ranks.
///
/// # Safety
/// `comm` points to a handle to fill; `store` to a store whose callbacks stay valid during
/// the call (xccl does not keep it); `storeHost` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommInitStore(
    comm: *mut xcclComm_t,
    store: *const xcclStore,
    nranks: c_int,
    rank: c_int,
    storeHost: *const c_char,
    timeoutSeconds: f64,
) -> xcclResult_t {
    const API: &str = "xcclCommInitStore";
    guard(|| {
        out_ok(API, "comm", comm)?;
        // SAFETY: NULL or the caller's valid store.
        let store = unsafe { store.as_ref() }.ok_or_else(|| invalid(API, "store is NULL"))?;
        if store.set.is_none() || store.get.is_none() || store.add.is_none() {
            return Err(invalid(API, "the store needs all three callbacks (set, get, add)"));
        }
        let (rank, size) = rank_size(API, nranks, rank)?;
        // SAFETY: NULL or a NUL-terminated string (the caller's contract).
        let host = (!storeHost.is_null())
            .then(|| unsafe { CStr::from_ptr(storeHost) }.to_string_lossy().into_owned());
        let mut config = Config::from_env()?;
        let timeout = if timeoutSeconds > 0.0 && timeoutSeconds.is_finite() {
            Duration::from_secs_f64(timeoutSeconds)
        } else if timeoutSeconds == 0.0 {
            config.timeout
        } else {
            return Err(invalid(
                API,
                format!("timeoutSeconds is {timeoutSeconds}; pass a positive number, or 0"),
            ));
        };
        // The caller's timeout also bounds each operation, unless XCCL_TIMEOUT says otherwise.
        if std::env::var_os("XCCL_TIMEOUT").is_none() {
            config.timeout = timeout;
        }
        let ip = group::listen_ip(host.as_deref())?;
        let mut kv = CStore { store };
        let auth = group::store_auth(&mut kv, rank, group::env_secret())?;
        let rv = Rendezvous::for_store(rank, size, auth, timeout)?;
        give(comm, Communicator::connect_with_store(&rv, &mut kv, ip, config)?, None)
    })
}

/// Splits `comm` as `MPI_Comm_split`: ranks passing the same `color` (≥ 0) form a new
/// communicator, ordered by `key` and then by their rank in `comm`; a rank passing
/// [`XCCL_SPLIT_NOCOLOR`] gets NULL. Collective over `comm`.
///
/// # Safety
/// `comm` is a live handle; `newcomm` points to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommSplit(
    comm: xcclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut xcclComm_t,
) -> xcclResult_t {
    const API: &str = "xcclCommSplit";
    guard(|| {
        let c = comm_ref(API, comm)?;
        out_ok(API, "newcomm", newcomm)?;
        let color = match color {
            XCCL_SPLIT_NOCOLOR => None,
            c if c >= 0 => Some(c as u32),
            c => return Err(invalid(API, format!("color is {c}; pass a color ≥ 0 or XCCL_SPLIT_NOCOLOR"))),
        };
        match c.split(color, key)? {
            Some(n) => give(newcomm, n, None),
            None => {
                // SAFETY: checked non-NULL above.
                unsafe { *newcomm = std::ptr::null_mut() };
                Ok(())
            }
        }
    })
}

/// A new communicator of the same ranks with its own stream (`MPI_Comm_dup`): its
/// operations never mix with `comm`'s. Collective over `comm`.
///
/// # Safety
/// `comm` is a live handle; `newcomm` points to a handle to fill.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommDup(comm: xcclComm_t, newcomm: *mut xcclComm_t) -> xcclResult_t {
    const API: &str = "xcclCommDup";
    guard(|| {
        let c = comm_ref(API, comm)?;
        out_ok(API, "newcomm", newcomm)?;
        give(newcomm, c.dup_with(c.config().clone())?, None)
    })
}

/// Aborts `comm` without destroying it, from any thread: its operation in progress fails
/// within moments, later ones fail at once ([`xcclAborted`](super::xcclAborted)), and its
/// peers' operations fail naming this rank and `reason` (NULL: none given). Destroy it then.
///
/// # Safety
/// `comm` is a live handle; `reason` is NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommAbortReason(comm: xcclComm_t, reason: *const c_char) -> xcclResult_t {
    guard(|| {
        let c = comm_ref("xcclCommAbort", comm)?;
        let reason = if reason.is_null() {
            "the program aborted it".to_string()
        } else {
            // SAFETY: the caller's NUL-terminated string.
            unsafe { CStr::from_ptr(reason) }.to_string_lossy().into_owned()
        };
        c.abort(&reason)
    })
}

/// Aborts `comm` (as [`xcclCommAbortReason`]) and frees it, as `ncclCommAbort`: pending
/// operations fail instead of completing. The handle is invalid afterwards.
///
/// # Safety
/// `comm` is a live handle (or NULL), not used by another thread after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommAbort(comm: xcclComm_t) -> xcclResult_t {
    if comm.is_null() {
        return xcclSuccess;
    }
    // SAFETY: same contract.
    let rc = unsafe { xcclCommAbortReason(comm, std::ptr::null()) };
    // SAFETY: same contract.
    let freed = unsafe { xcclCommDestroy(comm) };
    if rc != xcclSuccess { rc } else { freed }
}

/// Frees `comm` after its issued operations have completed (their handles stay valid), and
/// says goodbye to its peers. The handle is invalid afterwards; NULL is ignored.
///
/// # Safety
/// `comm` is a live handle (or NULL), not used by another thread after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommDestroy(comm: xcclComm_t) -> xcclResult_t {
    guard(|| {
        if !comm.is_null() {
            // SAFETY: the handle came from Box::into_raw in `give` and is freed once (the
            // caller's contract).
            drop(unsafe { Box::from_raw(comm) });
        }
        Ok(())
    })
}

/// Stores the number of ranks of `comm` in `*count`.
///
/// # Safety
/// `comm` is a live handle; `count` points to an int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommCount(comm: xcclComm_t, count: *mut c_int) -> xcclResult_t {
    guard(|| {
        let c = comm_ref("xcclCommCount", comm)?;
        out_ok("xcclCommCount", "count", count)?;
        // SAFETY: checked non-NULL.
        unsafe { *count = c.size() as c_int };
        Ok(())
    })
}

/// Stores this process's rank in `comm` in `*rank`.
///
/// # Safety
/// `comm` is a live handle; `rank` points to an int.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xcclCommUserRank(comm: xcclComm_t, rank: *mut c_int) -> xcclResult_t {
    guard(|| {
        let c = comm_ref("xcclCommUserRank", comm)?;
        out_ok("xcclCommUserRank", "rank", rank)?;
        // SAFETY: checked non-NULL.
        unsafe { *rank = c.rank() as c_int };
        Ok(())
    })
}
