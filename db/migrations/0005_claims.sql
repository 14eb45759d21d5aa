-- kerntune tuning database, schema 5: problems claimed by the run tuning them.
--
-- Several `tune` processes on one database (one a GPU of a node, each with its own
-- CUDA_VISIBLE_DEVICES or HIP_VISIBLE_DEVICES) take its problems in turn: a run claims a
-- problem before searching it, and the others pass it by while the claim holds. Recording the
-- problem's results, or the end of the run, releases it. A claim whose process is gone (on its
-- own host: no such process; elsewhere: past `expires_at`) no longer holds. Claims are a
-- division of work, not a lock: two runs tuning one problem only repeat each other's work.
CREATE TABLE claims (
    device_id  INTEGER NOT NULL REFERENCES devices (id) ON DELETE CASCADE,
    kernel_id  INTEGER NOT NULL REFERENCES kernels (id) ON DELETE CASCADE,
    problem    TEXT NOT NULL,             -- canonical problem key
    run_id     INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    host       TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    expires_at TEXT NOT NULL,
    PRIMARY KEY (device_id, kernel_id, problem)
);
