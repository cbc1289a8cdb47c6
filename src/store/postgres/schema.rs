//! The PostgreSQL schema, one migration step per version.

/// The schema, one step per version. Never edit a step that shipped: add one.
pub const MIGRATIONS: &[&str] = &[
    // 1: the tables of one or several gateways.
    "CREATE TABLE ledger (
        key text PRIMARY KEY,
        state text NOT NULL,
        expires_ms bigint NOT NULL,
        gateway text NOT NULL,
        record text NOT NULL
     );
     CREATE INDEX ledger_state ON ledger (state);
     CREATE TABLE proposals (
        id text PRIMARY KEY,
        state text NOT NULL,
        updated_ms bigint NOT NULL,
        proposal text NOT NULL
     );
     CREATE TABLE audit_outbox (
        gateway text NOT NULL,
        id bigint NOT NULL,
        entries text NOT NULL,
        PRIMARY KEY (gateway, id)
     );
     CREATE TABLE tool_pins (
        key text PRIMARY KEY,
        value text NOT NULL
     );",
    // 2: gateway leases.
    "CREATE TABLE gateways (
        id text PRIMARY KEY,
        epoch bigint NOT NULL,
        lease_until_ms bigint NOT NULL
     );",
    // 3: the lease epoch a key was reserved under.
    "ALTER TABLE ledger ADD COLUMN epoch bigint NOT NULL DEFAULT 0;",
    // 4: a proposal's revision, the compare of every write over it.
    "ALTER TABLE proposals ADD COLUMN revision bigint NOT NULL DEFAULT 0;",
    // 5: notifications waiting for delivery, leased to one gateway at a
    // time, and each webhook's status.
    "CREATE TABLE notices (
        key text PRIMARY KEY,
        next_ms bigint NOT NULL,
        gave_up boolean NOT NULL DEFAULT false,
        lease_owner text,
        lease_until bigint,
        notice text NOT NULL
     );
     CREATE INDEX notices_due ON notices (next_ms) WHERE NOT gave_up;
     CREATE TABLE notify_status (
        webhook text PRIMARY KEY,
        status text NOT NULL
     );",
    // 6: nonces of signed control requests, each usable once until it
    // expires (a captured request replayed at any gateway is refused).
    "CREATE TABLE used_nonces (
        nonce text PRIMARY KEY,
        expires_ms bigint NOT NULL
     );
     CREATE INDEX used_nonces_expiry ON used_nonces (expires_ms);",
    // 7: decision inputs (`[policy] inputs`), kept for a bounded window.
    "CREATE TABLE decision_inputs (
        key text PRIMARY KEY,
        tenant text NOT NULL,
        time_ms bigint NOT NULL,
        inputs text NOT NULL
     );
     CREATE INDEX decision_inputs_time ON decision_inputs (time_ms);
     CREATE INDEX decision_inputs_tenant ON decision_inputs (tenant);",
    // 8: held calls as tasks (DESIGN.md section 24): the task as JSON,
    // with the columns its look-ups and compare-and-set read.
    "CREATE TABLE tasks (
        id text PRIMARY KEY,
        tenant text NOT NULL,
        principal text NOT NULL,
        join_key text NOT NULL,
        proposal text,
        state text NOT NULL,
        revision bigint NOT NULL,
        created_ms bigint NOT NULL,
        updated_ms bigint NOT NULL,
        task text NOT NULL
     );
     CREATE INDEX tasks_owner ON tasks (tenant, principal);
     CREATE INDEX tasks_join ON tasks (join_key);
     CREATE INDEX tasks_open ON tasks (proposal) WHERE state IN ('waiting', 'claimed');",
    // 9: guards on the business effect (DESIGN.md section 25): one row per
    // call and guard, in the guard's group (kind, name and scope hashed).
    "CREATE TABLE guards (
        grp text NOT NULL,
        kind text NOT NULL,
        name text NOT NULL,
        tenant text NOT NULL,
        scope text NOT NULL,
        key text NOT NULL,
        amount numeric NOT NULL,
        at_ms bigint NOT NULL,
        until_ms bigint NOT NULL,
        PRIMARY KEY (grp, key)
     );
     CREATE INDEX guards_key ON guards (key);
     CREATE INDEX guards_window ON guards (grp, at_ms);
     CREATE INDEX guards_until ON guards (until_ms);",
    // 10: the review console's state, shared by the gateways (DESIGN.md
    // section 21): sessions, challenges, invitations, failed sign-ins and
    // passkey counters.
    "CREATE TABLE review_console (
        key text PRIMARY KEY,
        value text NOT NULL,
        until_ms bigint NOT NULL
     );
     CREATE INDEX review_console_until ON review_console (until_ms);",
    // 11: a proposal's tenant and requester as columns, indexed: a held call
    // reads its own requester's proposals, not the table.
    "ALTER TABLE proposals ADD COLUMN tenant text, ADD COLUMN requester text;
     UPDATE proposals SET tenant = proposal::jsonb->>'tenant', requester = proposal::jsonb->>'requester';
     CREATE INDEX proposals_requester ON proposals (tenant, requester);
     CREATE INDEX proposals_open ON proposals (id) WHERE state IN ('pending', 'approved');",
    // 12: the keys a gateway waits on while another one holds them: a
    // settled record is announced (`pg_notify`) only when someone waits on
    // it, not to every gateway's listener for every write.
    "CREATE TABLE ledger_waiters (
        key text NOT NULL,
        gateway text NOT NULL,
        since_ms bigint NOT NULL,
        PRIMARY KEY (key, gateway)
     );",
];
