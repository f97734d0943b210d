-- Approval policies: the approver may not be the requester; N distinct approvers.
-- requested_by: the user who started the run; approvers: JSON list of the users who
-- approved so far (the decision is recorded when approvals_needed of them have).
ALTER TABLE approvals ADD COLUMN requested_by TEXT;
ALTER TABLE approvals ADD COLUMN not_requester INTEGER NOT NULL DEFAULT 0;
ALTER TABLE approvals ADD COLUMN approvals_needed INTEGER NOT NULL DEFAULT 1;
ALTER TABLE approvals ADD COLUMN approvers TEXT;
