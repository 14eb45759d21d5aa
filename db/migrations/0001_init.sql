-- kerntune tuning database, schema 1.
-- Every measurement is kept (failures included, as data); winners point at the measurement that
-- won and are bound to the device identity and the kernel source hash they were measured with.

CREATE TABLE devices (
    id            INTEGER PRIMARY KEY,
    identity      TEXT NOT NULL UNIQUE,   -- what results are keyed by, e.g. cpu/<model>/avx512/2t
    kind          TEXT NOT NULL CHECK (kind IN ('cpu', 'gpu')),
    model         TEXT NOT NULL,
    arch          TEXT NOT NULL,          -- ISA level on a CPU, gfx/sm target on a GPU
    compute_units INTEGER NOT NULL,       -- threads on a CPU, CUs/SMs on a GPU
    runtime       TEXT NOT NULL,          -- driver/runtime version; '' on a CPU
    host          TEXT NOT NULL
);

CREATE TABLE kernels (
    id          INTEGER PRIMARY KEY,
    family      TEXT NOT NULL CHECK (family IN ('gemm', 'flash', 'paged')),
    backend     TEXT NOT NULL,
    variant     TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    UNIQUE (family, backend, variant, source_hash)
);

CREATE TABLE problems (
    id     INTEGER PRIMARY KEY,
    family TEXT NOT NULL CHECK (family IN ('gemm', 'flash', 'paged')),
    key    TEXT NOT NULL UNIQUE,          -- canonical problem key
    fields TEXT NOT NULL                  -- the problem as JSON
);

CREATE TABLE runs (
    id           INTEGER PRIMARY KEY,
    tool_version TEXT NOT NULL,
    command_line TEXT NOT NULL,
    device_id    INTEGER NOT NULL REFERENCES devices (id),
    started_at   TEXT NOT NULL,
    finished_at  TEXT,
    status       TEXT NOT NULL CHECK (status IN ('running', 'done', 'interrupted', 'failed'))
);

CREATE TABLE measurements (
    id          INTEGER PRIMARY KEY,
    run_id      INTEGER NOT NULL REFERENCES runs (id),
    device_id   INTEGER NOT NULL REFERENCES devices (id),
    kernel_id   INTEGER NOT NULL REFERENCES kernels (id),
    problem_id  INTEGER NOT NULL REFERENCES problems (id),
    config      TEXT NOT NULL,            -- the config as JSON
    status      TEXT NOT NULL CHECK (status IN ('ok', 'invalid', 'failed_verification', 'error')),
    message     TEXT,
    error       REAL,                     -- relative error against the reference
    median_ns   REAL,
    min_ns      REAL,
    p20_ns      REAL,
    p80_ns      REAL,
    reps        INTEGER,
    throughput  REAL,                     -- FLOP/s, or bytes/s for memory-bound problems
    unit        TEXT,
    cold_cache  INTEGER NOT NULL DEFAULT 1,
    measured_at TEXT NOT NULL
);

CREATE INDEX measurements_by_problem ON measurements (device_id, kernel_id, problem_id);

CREATE TABLE winners (
    device_id      INTEGER NOT NULL REFERENCES devices (id),
    kernel_id      INTEGER NOT NULL REFERENCES kernels (id),
    problem_id     INTEGER NOT NULL REFERENCES problems (id),
    measurement_id INTEGER NOT NULL REFERENCES measurements (id),
    config         TEXT NOT NULL,
    median_ns      REAL NOT NULL,
    default_ns     REAL,
    speedup        REAL,                  -- default median / winner median
    tool_version   TEXT NOT NULL,
    updated_at     TEXT NOT NULL,
    PRIMARY KEY (device_id, kernel_id, problem_id)
);

-- The runtime loads every winner of one device at start-up.
CREATE INDEX winners_by_device ON winners (device_id, kernel_id);
