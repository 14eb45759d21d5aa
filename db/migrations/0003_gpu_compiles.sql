-- kerntune tuning database, schema 3: offline GPU compiles.
--
-- Every candidate the offline plan compiled, keyed by kernel source hash, target, compiler
-- and build (source file and -D macros): the resources read from its code object, or why
-- it failed, and the code object itself, so neither a later plan nor the device run compiles
-- it again.
CREATE TABLE gpu_compiles (
    id          INTEGER PRIMARY KEY,
    source_hash TEXT NOT NULL,
    target      TEXT NOT NULL,           -- gfx90a, gfx940, gfx942, sm_90
    compiler    TEXT NOT NULL,           -- the compiler's version line
    build       TEXT NOT NULL,           -- e.g. gemm.hip KT_DTYPE=2 KT_VARIANT=1 ...
    status      TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    message     TEXT,                    -- the compiler's errors when it failed
    resources   TEXT,                    -- JSON: each kernel's registers, LDS, scratch, spills
    code_object BLOB,
    compiled_at TEXT NOT NULL,
    UNIQUE (source_hash, target, compiler, build)
);
