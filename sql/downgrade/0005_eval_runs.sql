-- Undo 0005 exactly.
drop table pgrag.eval_runs;
