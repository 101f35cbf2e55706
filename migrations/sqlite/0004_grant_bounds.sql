-- A session grant approves later calls only up to what the granting approval itself covered:
-- its risk (as a rank, LOW = 1 … CRITICAL = 4) and its quorum. Grants made before this
-- migration carry no bounds and so approve nothing more (fail closed).
ALTER TABLE grants ADD COLUMN max_risk_rank INTEGER NOT NULL DEFAULT 0;
ALTER TABLE grants ADD COLUMN max_required_approvals INTEGER NOT NULL DEFAULT 0;
