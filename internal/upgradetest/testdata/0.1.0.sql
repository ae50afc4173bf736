-- The data of an outbox and its flows as Wharf 0.1.0 left them
-- (internal/upgradetest.Build, dumped by pg_dump). Written once at the release; never edit.
-- The migrations fill lanes; the dump has its rows as the relay left them.
DELETE FROM {{schema}}.lanes;
INSERT INTO {{schema}}.dead_letters VALUES (1000000, 'orders', 'k0', '\x226465616422', NULL, NULL, '2026-12-07 22:20:07.690753+00', 12, 'gave up', '2026-12-07 22:20:07.690753+00', 77, NULL);

INSERT INTO {{schema}}.flow_definitions VALUES ('order', 'reserve', '{reserve,expire,paid}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('shipment', 'pack', '{pack,joined}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('parcel', 'wait', '{wait,picked}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('flaky', 'start', '{start}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('slow', 'work', '{work}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('note', 'write', '{write}', 'upgrade-fixture', '2026-12-07 22:20:07.691988+00');

INSERT INTO {{schema}}.flow_instances VALUES (1, 'order', 'o1', 'awaiting', 'paid', '{"id": "o1"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 22:20:07.703491+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (2, 'order', 'o2', 'awaiting', 'paid', '{"id": "o2"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 22:20:07.703491+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (3, 'order', 'o3', 'awaiting', 'paid', '{"id": "o3"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 22:20:07.703491+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (5, 'shipment', 's1', 'joining', 'joined', '{"id": "s1", "items": ["s1-a", "s1-b"]}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (6, 'shipment', 's2', 'joining', 'joined', '{"id": "s2", "items": ["s2-a", "s2-b"]}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (7, 'flaky', 'f1', 'failed', 'start', '{"id": "f1"}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, 'a bug, fixed in the next release', NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_instances VALUES (8, 'flaky', 'f2', 'failed', 'start', '{"id": "f2"}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, 'a bug, fixed in the next release', NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_instances VALUES (9, 'note', NULL, 'done', 'write', '{"id": "n1"}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, 'mail', NULL, NULL, NULL, 0, false, '"n1"', NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_instances VALUES (10, 'note', NULL, 'done', 'write', '{"id": "n2"}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, 'mail', NULL, NULL, NULL, 0, false, '"n2"', NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.719193+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_instances VALUES (11, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s1-a"}', 0, 0, 'infinity', '2026-12-07 22:20:07.719193+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 5, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.718445+00', '2026-12-07 22:20:07.728152+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (12, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s1-b"}', 0, 0, 'infinity', '2026-12-07 22:20:07.719193+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 5, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.718445+00', '2026-12-07 22:20:07.735029+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (13, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s2-a"}', 0, 0, 'infinity', '2026-12-07 22:20:07.719193+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 6, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.718445+00', '2026-12-07 22:20:07.737591+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (14, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s2-b"}', 0, 0, 'infinity', '2026-12-07 22:20:07.719193+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 6, 1, false, NULL, NULL, NULL, '2026-12-07 22:20:07.718445+00', '2026-12-07 22:20:07.739982+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (4, 'order', 'o4', 'cancelled', 'paid', '{"id": "o4"}', 0, 0, 'infinity', '2026-12-07 22:20:07.703491+00', NULL, 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.703491+00', '2026-12-07 22:20:07.756121+00', '2026-12-07 22:20:07.756121+00');
INSERT INTO {{schema}}.flow_instances VALUES (15, 'order', 'o5', 'ready', 'reserve', '{"id": "o5"}', 0, 0, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (16, 'order', 'o6', 'ready', 'reserve', '{"id": "o6"}', 0, 0, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (17, 'shipment', 's3', 'ready', 'pack', '{"id": "s3", "items": ["s3-a", "s3-b"]}', 0, 0, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (18, 'note', NULL, 'ready', 'write', '{"id": "n3"}', 0, 0, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL, 0, NULL, NULL, 1, false, 'mail', NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.757634+00', '2026-12-07 22:20:07.757634+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (19, 'slow', 'w1', 'running', 'work', '{"id": "w1"}', 0, 0, '2026-12-07 22:20:37.764573+00', '2026-12-07 22:20:07.763828+00', 'upgrade-fixture-killed', 1, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 22:20:07.763828+00', '2026-12-07 22:20:07.764573+00', NULL);

INSERT INTO {{schema}}.flow_keys VALUES ('mail', NULL, 1000, 10, 8, '2026-12-07 22:20:07.712389+00', NULL);
INSERT INTO {{schema}}.flow_keys VALUES ('dock', 1, NULL, NULL, 0, '2026-12-07 22:20:07.725572+00', NULL);

INSERT INTO {{schema}}.flow_runners OVERRIDING SYSTEM VALUE VALUES ('upgrade-fixture-killed', 2, '00:00:30', '2026-12-07 22:20:27.764597+00');

INSERT INTO {{schema}}.flow_signals VALUES (1, 15, 'payment', NULL, 'psp-early', '2026-12-07 22:20:07.759268+00', NULL, NULL);

INSERT INTO {{schema}}.flow_steps VALUES (1, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717638+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (2, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717647+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (3, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717652+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (4, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717658+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (5, 'pack', 0, 'spawn', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717546+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (6, 'pack', 0, 'spawn', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717674+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (7, 'start', 0, 'fail', 'a bug, fixed in the next release', 'upgrade-fixture', '2026-12-07 22:20:07.717682+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (8, 'start', 0, 'fail', 'a bug, fixed in the next release', 'upgrade-fixture', '2026-12-07 22:20:07.717665+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (9, 'write', 0, 'done', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717687+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (10, 'write', 0, 'done', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.717546+00', '2026-12-07 22:20:07.719193+00');
INSERT INTO {{schema}}.flow_steps VALUES (11, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.72787+00', '2026-12-07 22:20:07.728152+00');
INSERT INTO {{schema}}.flow_steps VALUES (12, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.734738+00', '2026-12-07 22:20:07.735029+00');
INSERT INTO {{schema}}.flow_steps VALUES (13, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.734913+00', '2026-12-07 22:20:07.737591+00');
INSERT INTO {{schema}}.flow_steps VALUES (14, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 22:20:07.737491+00', '2026-12-07 22:20:07.739982+00');

INSERT INTO {{schema}}.lanes VALUES (0, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (1, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (2, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (3, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (4, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (5, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (6, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (7, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (8, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (9, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (10, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (11, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (12, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (13, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (14, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (15, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (16, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (17, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (18, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (19, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (20, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (21, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (22, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (23, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (24, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (25, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (26, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (27, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (28, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (29, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (30, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (31, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (32, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (33, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (34, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (35, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (36, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (37, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (38, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (39, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (40, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (41, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (42, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (43, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (44, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (45, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (46, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (47, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (48, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (49, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (50, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (51, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (52, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (53, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (54, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (55, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (56, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (57, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (58, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (59, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (60, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (61, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (62, 'upgrade-fixture-killed', 1);
INSERT INTO {{schema}}.lanes VALUES (63, 'upgrade-fixture-killed', 1);

INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (1, '733', DEFAULT, 'orders', 'held', '\x7b2268656c64223a20747275657d', NULL, NULL, NULL, '2026-12-07 22:20:07.66606+00', 4270117828299151735);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (2, '737', DEFAULT, 'orders', 'k0', '\x7b226e223a20307d', NULL, NULL, NULL, '2026-12-07 22:20:07.681486+00', 3598313264046274899);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (3, '738', DEFAULT, 'orders', 'k1', '\x7b226e223a20317d', NULL, NULL, NULL, '2026-12-07 22:20:07.681933+00', 1480127983312666013);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (4, '739', DEFAULT, 'orders', 'k2', '\x7b226e223a20327d', NULL, NULL, NULL, '2026-12-07 22:20:07.682294+00', 2042141805708154482);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (5, '740', DEFAULT, 'orders', 'k0', '\x7b226e223a20337d', NULL, NULL, NULL, '2026-12-07 22:20:07.682543+00', 3488538902443995252);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (6, '741', DEFAULT, 'orders', 'k1', '\x7b226e223a20347d', NULL, NULL, NULL, '2026-12-07 22:20:07.682781+00', 576590276320632635);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (7, '742', DEFAULT, 'orders', 'k2', '\x7b226e223a20357d', NULL, NULL, NULL, '2026-12-07 22:20:07.683055+00', 2933294892678807535);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (8, '743', DEFAULT, 'orders', 'k0', '\x7b226e223a20367d', NULL, NULL, NULL, '2026-12-07 22:20:07.683251+00', 3789381367911861029);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (9, '744', DEFAULT, 'orders', 'k1', '\x7b226e223a20377d', NULL, NULL, NULL, '2026-12-07 22:20:07.683488+00', 584175502824103382);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (10, '745', DEFAULT, 'orders', 'k2', '\x7b226e223a20387d', NULL, NULL, NULL, '2026-12-07 22:20:07.683634+00', 4557332024843663942);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (11, '746', DEFAULT, 'orders', 'k0', '\x7b226e223a20397d', NULL, NULL, NULL, '2026-12-07 22:20:07.68379+00', 1212222696621791767);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (12, '747', DEFAULT, 'orders', 'k1', '\x7b226e223a2031307d', NULL, NULL, NULL, '2026-12-07 22:20:07.684136+00', 741507622681030657);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (13, '748', DEFAULT, 'orders', 'k2', '\x7b226e223a2031317d', NULL, NULL, NULL, '2026-12-07 22:20:07.685323+00', 4243099230951163021);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (14, '749', DEFAULT, 'orders', 'k0', '\x7b226e223a2031327d', NULL, NULL, NULL, '2026-12-07 22:20:07.685548+00', 3989734223950248408);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (15, '750', DEFAULT, 'orders', 'k1', '\x7b226e223a2031337d', NULL, NULL, NULL, '2026-12-07 22:20:07.685685+00', 1195196541631480280);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (16, '751', DEFAULT, 'orders', 'k2', '\x7b226e223a2031347d', NULL, NULL, NULL, '2026-12-07 22:20:07.685806+00', 3723115812364468136);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (17, '752', DEFAULT, 'orders', 'k0', '\x7b226e223a2031357d', NULL, NULL, NULL, '2026-12-07 22:20:07.685942+00', 2680696122878719165);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (18, '753', DEFAULT, 'orders', 'k1', '\x7b226e223a2031367d', NULL, NULL, NULL, '2026-12-07 22:20:07.686078+00', 2825733045877273871);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (19, '754', DEFAULT, 'orders', 'k2', '\x7b226e223a2031377d', NULL, NULL, NULL, '2026-12-07 22:20:07.686208+00', 3308724424714753766);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (20, '755', DEFAULT, 'orders', 'k0', '\x7b226e223a2031387d', NULL, NULL, NULL, '2026-12-07 22:20:07.686331+00', 3010027990379469523);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (21, '756', DEFAULT, 'orders', 'k1', '\x7b226e223a2031397d', NULL, NULL, NULL, '2026-12-07 22:20:07.686447+00', 3837899596835513265);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (22, '757', DEFAULT, 'orders', 'k2', '\x7b226e223a2032307d', NULL, NULL, NULL, '2026-12-07 22:20:07.686559+00', 1495410971815945413);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (23, '758', DEFAULT, 'orders', 'k0', '\x7b226e223a2032317d', NULL, NULL, NULL, '2026-12-07 22:20:07.686672+00', 1428636796257131664);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (24, '759', DEFAULT, 'orders', 'k1', '\x7b226e223a2032327d', NULL, NULL, NULL, '2026-12-07 22:20:07.686794+00', 1101386716956621602);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (25, '760', DEFAULT, 'orders', 'k2', '\x7b226e223a2032337d', NULL, NULL, NULL, '2026-12-07 22:20:07.686907+00', 3406677329200647143);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (26, '761', DEFAULT, 'orders', 'k0', '\x7b226e223a2032347d', NULL, NULL, NULL, '2026-12-07 22:20:07.687019+00', 2827478854774475332);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (27, '762', DEFAULT, 'orders', 'k1', '\x7b226e223a2032357d', NULL, NULL, NULL, '2026-12-07 22:20:07.68713+00', 1537374610834901451);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (28, '763', DEFAULT, 'orders', 'k2', '\x7b226e223a2032367d', NULL, NULL, NULL, '2026-12-07 22:20:07.687241+00', 4265953094650494201);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (29, '764', DEFAULT, 'orders', 'k0', '\x7b226e223a2032377d', NULL, NULL, NULL, '2026-12-07 22:20:07.687353+00', 3277938149925721930);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (30, '765', DEFAULT, 'orders', 'k1', '\x7b226e223a2032387d', NULL, NULL, NULL, '2026-12-07 22:20:07.687465+00', 1505798730418568980);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (31, '766', DEFAULT, 'orders', 'k2', '\x7b226e223a2032397d', NULL, NULL, NULL, '2026-12-07 22:20:07.687575+00', 3872321062179880966);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (32, '767', DEFAULT, 'audit', NULL, '\x7b22756e6b65796564223a20317d', NULL, NULL, NULL, '2026-12-07 22:20:07.687689+00', 1433313308936868370);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (33, '768', DEFAULT, 'audit', NULL, '\x7b22756e6b65796564223a20327d', NULL, NULL, NULL, '2026-12-07 22:20:07.6879+00', 162135958073130520);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (34, '769', DEFAULT, 'orders', 'h1', '\x7b2268656164657273223a20747275657d', '{"trace": "t-1", "tenant": "acme"}', NULL, NULL, '2026-12-07 22:20:07.689389+00', 649549427428024797);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (35, '770', DEFAULT, 'orders', 'd1', '\x7b226465647570223a20747275657d', NULL, NULL, 'evt-1', '2026-12-07 22:20:07.689645+00', 4554169026679719713);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (36, '771', DEFAULT, 'orders', 'p1', '\x7b227363686564756c6564223a202270617374227d', NULL, '2026-12-07 21:20:07.689936+00', NULL, '2026-12-07 22:20:07.689936+00', 917609599868206839);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (37, '772', DEFAULT, 'orders', 'f1', '\x7b227363686564756c6564223a202232313030227d', NULL, '2100-01-01 00:00:00+00', NULL, '2026-12-07 22:20:07.690139+00', 2104739636433193235);

INSERT INTO {{schema}}.relays VALUES ('upgrade-fixture-killed', 'vm', 11937, '2026-12-07 22:20:07.674796+00', '2026-12-07 22:20:07.676161+00', '0e1ce30553075d50', '2026-12-07 22:20:17.676161+00');

INSERT INTO {{schema}}.retries VALUES (5, 32, 2, '2026-12-07 22:20:07.690325+00', 'earlier failure', '2026-12-07 22:20:07.690325+00', 3488538902443995252);

SELECT pg_catalog.setval('{{schema}}.flow_instances_id_seq', 19, true);

SELECT pg_catalog.setval('{{schema}}.flow_runners_key_seq', 2, true);

SELECT pg_catalog.setval('{{schema}}.flow_signals_id_seq', 2, true);

SELECT pg_catalog.setval('{{schema}}.outbox_id_seq', 37, true);
