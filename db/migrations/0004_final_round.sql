-- kerntune tuning database, schema 4: the final round.
--
-- A tuner picks each problem's winner from a final round: the default and the fastest
-- candidates of its search timed again, side by side. Those measurements are marked, so a
-- merge or a garbage collection that chooses winners again chooses among them, as the tuner
-- did, and not the search's luckiest timing. Rows written before the mark existed carry it
-- in their message.
ALTER TABLE measurements ADD COLUMN final_round INTEGER NOT NULL DEFAULT 0;
UPDATE measurements SET final_round = 1 WHERE message LIKE 'final round:%';
