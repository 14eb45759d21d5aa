-- kerntune tuning database, schema 2: results travel between machines.
--
-- Runs and measurements get stable ids, so importing or merging the same rows twice adds
-- nothing; runs say which host measured them and whether they were measured into this file
-- or imported; each problem's default-config measurement is marked, so a winner's speedup can
-- be recomputed wherever it lands; and each device gets a compact snapshot of its winners,
-- which the runtime reads in one row instead of one row per winner.

ALTER TABLE runs ADD COLUMN uid TEXT;
UPDATE runs SET uid = lower(hex(randomblob(16)));
CREATE UNIQUE INDEX runs_by_uid ON runs (uid);
ALTER TABLE runs ADD COLUMN host TEXT NOT NULL DEFAULT '';
UPDATE runs SET host = (SELECT host FROM devices WHERE devices.id = runs.device_id);
ALTER TABLE runs ADD COLUMN origin TEXT NOT NULL DEFAULT 'local'
    CHECK (origin IN ('local', 'imported'));
ALTER TABLE runs ADD COLUMN imported_from TEXT;   -- the export file or database, when imported

ALTER TABLE measurements ADD COLUMN uid TEXT;
UPDATE measurements SET uid = lower(hex(randomblob(16)));
CREATE UNIQUE INDEX measurements_by_uid ON measurements (uid);
ALTER TABLE measurements ADD COLUMN is_default INTEGER NOT NULL DEFAULT 0;
UPDATE measurements SET is_default = 1 WHERE EXISTS (
    SELECT 1 FROM winners w
    WHERE w.device_id = measurements.device_id AND w.kernel_id = measurements.kernel_id
      AND w.problem_id = measurements.problem_id AND w.default_ns = measurements.median_ns);

-- One row per device: its winners as JSON, grouped by kernel version and config. Any change
-- to that device's winners drops the row (triggers below), so a snapshot present is current;
-- writers rebuild it when they finish.
CREATE TABLE winner_snapshots (
    device_id INTEGER PRIMARY KEY REFERENCES devices (id),
    winners   INTEGER NOT NULL,
    body      BLOB NOT NULL,
    built_at  TEXT NOT NULL
);

CREATE TRIGGER winners_insert_drops_snapshot AFTER INSERT ON winners BEGIN
    DELETE FROM winner_snapshots WHERE device_id = NEW.device_id;
END;
CREATE TRIGGER winners_update_drops_snapshot AFTER UPDATE ON winners BEGIN
    DELETE FROM winner_snapshots WHERE device_id IN (OLD.device_id, NEW.device_id);
END;
CREATE TRIGGER winners_delete_drops_snapshot AFTER DELETE ON winners BEGIN
    DELETE FROM winner_snapshots WHERE device_id = OLD.device_id;
END;
