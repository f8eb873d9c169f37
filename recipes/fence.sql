-- fence.sql: the fence in PostgreSQL, one function (CI runs it on PostgreSQL 15).
--
--   psql -v ON_ERROR_STOP=1 -f recipes/fence.sql
--   then SELECT fenced_write(resource, epoch, sequence, value), one write, its answer back
--
-- A write (resource, epoch, sequence, value) is stored, and answers 'applied', when no row is
-- stored or when the stored value is not 'done' and (epoch, sequence) is above the stored pair.
-- Otherwise nothing changes, and it answers 'replay' if (epoch, sequence, value) is what is
-- stored, else 'done' if the stored value is 'done' (a finished job stays finished), else 'stale'
-- if (epoch, sequence) differs from the stored pair, else 'conflict'.
--
-- In your transactions (README, "The fence in your own store"):
-- - READ COMMITTED, the default: each statement reads what is committed when it starts.
--   REPEATABLE READ and SERIALIZABLE take one snapshot, at the transaction's first statement
--   that reads or writes (`SELECT 1` counts; `SET` does not): a write whose row another
--   transaction changed and committed after it fails with SQLSTATE 40001, even one that would
--   answer 'stale' or 'replay' (a refused write changes nothing). SERIALIZABLE also fails with
--   40001 for the transaction's other reads, at any statement or at COMMIT, the fenced row
--   unchanged. Retry the whole transaction: its earlier statements, an 'applied' too, were
--   rolled back.
-- - Beside your own rows, 'applied' holds only if the transaction commits. The row stays locked
--   until COMMIT or ROLLBACK, refused write or not, so a paused old holder with an open
--   transaction holds up the new holder: keep the transaction short, or bound the wait with
--   `ALTER FUNCTION public.fenced_write SET lock_timeout = '2s'` (SQLSTATE 55P03 when it runs
--   out), which holds for every call, lone statements too; re-loading this file drops it.
--   `SET LOCAL lock_timeout` holds only inside a transaction block (alone, it only warns).
-- - Two transactions that write the same rows in opposite orders can deadlock (40P01, one of
--   them rolled back), refused writes too: write rows in one order, by resource.
-- - Statement pooling (PgBouncer's pool_mode=statement): send one `SELECT fenced_write(...)`
--   alone, a transaction of its own. A setting one client leaves on the server session is the
--   next client's: `SET default_transaction_isolation = 'repeatable read'` makes even that
--   single statement fail with 40001 when it waits for a writer that then commits.

-- A table of your own stays as it is (IF NOT EXISTS): it needs these four columns, in any
-- order, beside others that have defaults; the function takes their types. A nullable value
-- works as it is. Load this file as the schema's owner (PostgreSQL 15: others may not create
-- in public). After changing a column's type, DROP FUNCTION public.fenced_write first:
-- re-loading would leave the old function beside a new one.
CREATE TABLE IF NOT EXISTS public.fenced (resource text PRIMARY KEY, epoch bigint NOT NULL,
  sequence bigint NOT NULL, value text NOT NULL);

-- The parameters take the columns' types (PostgreSQL says NOTICE: "type reference ... converted
-- to"), without their modifiers: a numeric(12,2) column makes w_value a plain numeric.
CREATE OR REPLACE FUNCTION public.fenced_write(w_resource public.fenced.resource%TYPE,
  w_epoch public.fenced.epoch%TYPE, w_sequence public.fenced.sequence%TYPE,
  w_value public.fenced.value%TYPE)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  -- The write in the columns' exact types: numeric(12,2) keeps 10.005 as 10.01, as the row
  -- would. Compared raw, the same write twice answers 'applied', then 'conflict'.
  r public.fenced.resource%TYPE := w_resource;
  e public.fenced.epoch%TYPE := w_epoch;
  s public.fenced.sequence%TYPE := w_sequence;
  v public.fenced.value%TYPE := w_value;
BEGIN
  -- public.fenced, never fenced: a temporary table named fenced, searched first, would take
  -- every write (a stale one answering 'applied'). The columns named: any order works. `::text`
  -- lets any value type say 'done': a value whose text form is done (a json or jsonb "done"
  -- is not: its text form keeps the quotes). IS DISTINCT FROM lets a stored NULL be written over.
  INSERT INTO public.fenced AS f (resource, epoch, sequence, value) VALUES (r, e, s, v)
    ON CONFLICT (resource) DO UPDATE
    SET epoch = excluded.epoch, sequence = excluded.sequence, value = excluded.value
    WHERE (f.epoch, f.sequence) < (excluded.epoch, excluded.sequence)
      AND f.value::text IS DISTINCT FROM 'done';
  IF FOUND THEN  -- the upsert wrote
    RETURN 'applied';
  END IF;
  -- Refused: the upsert still locked the row, so it stays as it is until this transaction
  -- ends, and this new statement reads it as it stays. IS NOT DISTINCT FROM: NULL replays NULL.
  RETURN (SELECT CASE
      WHEN (f.epoch, f.sequence, f.value) IS NOT DISTINCT FROM (e, s, v) THEN 'replay'
      WHEN f.value::text = 'done' THEN 'done'
      WHEN (f.epoch, f.sequence) <> (e, s) THEN 'stale'
      ELSE 'conflict' END
    FROM public.fenced AS f WHERE f.resource = r);
END $$;
