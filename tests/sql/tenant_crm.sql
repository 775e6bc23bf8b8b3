-- A small multi-tenant CRM for tests/test_security.py, created by a superuser: accounts
-- (tenant-scoped; emails masked, phones omitted), their tickets (children, tenant-scoped) and
-- a shared FAQ (no tenant). The writer role may read, write and watch it; the reader nothing.
create schema crm;

create table crm.accounts (
    account_id integer primary key,
    tenant_id text,
    name text not null,
    email text not null,
    phone text,
    plan text not null,
    seats integer not null,
    notes text not null default ''
);

create table crm.tickets (
    ticket_id integer primary key,
    account_id integer not null references crm.accounts,
    tenant_id text,
    status text not null,
    body text not null
);

create table crm.faq (
    faq_id integer primary key,
    question text not null,
    answer text not null
);

grant usage on schema crm to pgrag_writer;
grant select, insert, update, delete, trigger on all tables in schema crm to pgrag_writer;
