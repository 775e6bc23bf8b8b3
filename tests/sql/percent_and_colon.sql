-- Must reach PostgreSQL untouched: no driver or SQLAlchemy placeholder parsing.
create table percent_colon (id int, doc jsonb, label text);
insert into percent_colon values (1, '{"a":1}', format('%I.%I', 'my schema', 'T'));
insert into percent_colon values (2, '{"b": ":name"}', 'ratio 50%');
