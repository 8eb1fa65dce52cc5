"""Operations on a running cluster: load tests (:mod:`operate.loadtest`) and score calibration
(:mod:`operate.calibrate`), scenario files as data (:mod:`operate.scenario`), reports through one writer
(:mod:`operate.report`). The CLI commands are glue around these."""
