-- The sweep reads pending approvals by their due time (approvals_pending_by_due): the index
-- by deadline alone has no reader left, and every approval write paid for it.
DROP INDEX approvals_pending_by_expiry;
