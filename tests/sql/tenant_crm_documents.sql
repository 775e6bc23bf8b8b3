-- The CRM's document types and statistics (tests/sql/tenant_crm.sql), declared by the writer.
select pgrag.declare_document(
    'crm_account',
    $$select a.account_id as source_key, a.tenant_id, a.email, a.phone,
             format('Account %s on the %s plan with %s seats. Contact %s, phone %s. Notes: %s',
                    a.name, a.plan, a.seats, a.email, coalesce(a.phone, 'none'), a.notes) as text,
             jsonb_build_object('account_id', a.account_id, 'name', a.name, 'plan', a.plan,
                                'seats', a.seats, 'contact', a.email) as metadata
      from crm.accounts a$$,
    '{"crm.accounts": "select account_id from changed"}',
    metadata_schema => '{"account_id": "integer", "name": "text", "plan": "text",
                         "seats": "integer", "contact": "text"}',
    tenant_column => 'tenant_id',
    sensitive => '{"email": "mask", "phone": "omit"}');

select pgrag.declare_document(
    'crm_ticket',
    $$select t.ticket_id as source_key, t.account_id as parent_key, t.tenant_id,
             format('Ticket %s (%s): %s', t.ticket_id, t.status, t.body) as text,
             jsonb_build_object('account_id', t.account_id, 'status', t.status) as metadata
      from crm.tickets t$$,
    '{"crm.tickets": "select ticket_id from changed"}',
    'crm_account',
    '{"account_id": "integer", "status": "text"}',
    tenant_column => 'tenant_id');

select pgrag.declare_document(
    'crm_faq',
    $$select f.faq_id as source_key, f.question || E'\n' || f.answer as text,
             jsonb_build_object('faq_id', f.faq_id) as metadata
      from crm.faq f$$,
    '{"crm.faq": "select faq_id from changed"}',
    metadata_schema => '{"faq_id": "integer"}');

select pgrag.declare_stats('crm_account', $$
select jsonb_build_object('accounts', count(*), 'seats', coalesce(sum(a.seats), 0))
from hits h join crm.accounts a on a.account_id = h.source_key::integer$$);

select pgrag.declare_stats('crm_ticket', $$
select jsonb_build_object('tickets', count(*), 'open', count(*) filter (where t.status = 'open'))
from hits h join crm.tickets t on t.ticket_id = h.source_key::integer$$);
