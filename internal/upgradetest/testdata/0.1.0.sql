-- The data of an outbox and its flows as Wharf 0.1.0 left them
-- (internal/upgradetest.Build, dumped by pg_dump). Written once at the release; never edit.
-- The migrations fill lanes; the dump has its rows as the relay left them.
DELETE FROM {{schema}}.lanes;
INSERT INTO {{schema}}.dead_letters VALUES (1000000, 'orders', 'k0', '\x226465616422', NULL, NULL, '2026-12-07 21:43:50.236301+00', 12, 'gave up', '2026-12-07 21:43:50.236301+00', 77, NULL);

INSERT INTO {{schema}}.flow_definitions VALUES ('order', 'reserve', '{reserve,expire,paid}', 'upgrade-fixture', '2026-12-07 21:43:50.239625+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('shipment', 'pack', '{pack,joined}', 'upgrade-fixture', '2026-12-07 21:43:50.239625+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('parcel', 'wait', '{wait,picked}', 'upgrade-fixture', '2026-12-07 21:43:50.239625+00');
INSERT INTO {{schema}}.flow_definitions VALUES ('flaky', 'start', '{start}', 'upgrade-fixture', '2026-12-07 21:43:50.239625+00');

INSERT INTO {{schema}}.flow_instances VALUES (7, 'flaky', 'f2', 'failed', 'start', '{"id": "f2"}', 0, 0, 'infinity', '2026-12-07 21:43:50.246866+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, 'a bug, fixed in the next release', NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.289999+00', '2026-12-07 21:43:50.289999+00');
INSERT INTO {{schema}}.flow_instances VALUES (1, 'order', 'o1', 'awaiting', 'paid', '{"id": "o1"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 21:43:50.246866+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (2, 'order', 'o2', 'awaiting', 'paid', '{"id": "o2"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 21:43:50.246866+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (3, 'order', 'o3', 'awaiting', 'paid', '{"id": "o3"}', 0, 0, '2100-01-01 00:00:00+00', '2026-12-07 21:43:50.246866+00', 'upgrade-fixture', 2, NULL, NULL, 1, false, NULL, '{payment}', 'expire', NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (4, 'shipment', 's1', 'joining', 'joined', '{"id": "s1", "items": ["s1-a", "s1-b"]}', 0, 0, 'infinity', '2026-12-07 21:43:50.246866+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (5, 'shipment', 's2', 'joining', 'joined', '{"id": "s2", "items": ["s2-a", "s2-b"]}', 0, 0, 'infinity', '2026-12-07 21:43:50.246866+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (6, 'flaky', 'f1', 'failed', 'start', '{"id": "f1"}', 0, 0, 'infinity', '2026-12-07 21:43:50.246866+00', NULL, 2, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, 'a bug, fixed in the next release', NULL, '2026-12-07 21:43:50.246866+00', '2026-12-07 21:43:50.302535+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_instances VALUES (8, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s1-a"}', 0, 0, 'infinity', '2026-12-07 21:43:50.302535+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 4, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.302424+00', '2026-12-07 21:43:50.317155+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (9, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s1-b"}', 0, 0, 'infinity', '2026-12-07 21:43:50.302535+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 4, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.302424+00', '2026-12-07 21:43:50.34065+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (10, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s2-a"}', 0, 0, 'infinity', '2026-12-07 21:43:50.302535+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 5, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.302424+00', '2026-12-07 21:43:50.347623+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (11, 'parcel', NULL, 'awaiting', 'picked', '{"item": "s2-b"}', 0, 0, 'infinity', '2026-12-07 21:43:50.302535+00', NULL, 2, NULL, 'dock', 1, false, NULL, '{pickup}', NULL, 5, 1, false, NULL, NULL, NULL, '2026-12-07 21:43:50.302424+00', '2026-12-07 21:43:50.348962+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (12, 'order', 'o4', 'ready', 'reserve', '{"id": "o4"}', 0, 0, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (13, 'order', 'o5', 'ready', 'reserve', '{"id": "o5"}', 0, 0, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL);
INSERT INTO {{schema}}.flow_instances VALUES (14, 'shipment', 's3', 'ready', 'pack', '{"id": "s3", "items": ["s3-a", "s3-b"]}', 0, 0, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL, 0, NULL, NULL, 1, false, NULL, NULL, NULL, NULL, 0, false, NULL, NULL, NULL, '2026-12-07 21:43:50.368366+00', '2026-12-07 21:43:50.368366+00', NULL);

INSERT INTO {{schema}}.flow_keys VALUES ('dock', 1, NULL, NULL, 0, '2026-12-07 21:43:50.308509+00', NULL);

INSERT INTO {{schema}}.flow_signals VALUES (1, 12, 'payment', NULL, 'psp-early', '2026-12-07 21:43:50.370297+00', NULL, NULL);

INSERT INTO {{schema}}.flow_steps VALUES (7, 'start', 0, 'fail', 'a bug, fixed in the next release', 'upgrade-fixture', '2026-12-07 21:43:50.282764+00', '2026-12-07 21:43:50.289999+00');
INSERT INTO {{schema}}.flow_steps VALUES (1, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.283027+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (2, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.283042+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (3, 'reserve', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.282844+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (4, 'pack', 0, 'spawn', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.283119+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (5, 'pack', 0, 'spawn', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.283058+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (6, 'start', 0, 'fail', 'a bug, fixed in the next release', 'upgrade-fixture', '2026-12-07 21:43:50.283126+00', '2026-12-07 21:43:50.302535+00');
INSERT INTO {{schema}}.flow_steps VALUES (8, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.315543+00', '2026-12-07 21:43:50.317155+00');
INSERT INTO {{schema}}.flow_steps VALUES (9, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.340369+00', '2026-12-07 21:43:50.34065+00');
INSERT INTO {{schema}}.flow_steps VALUES (10, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.34048+00', '2026-12-07 21:43:50.347623+00');
INSERT INTO {{schema}}.flow_steps VALUES (11, 'wait', 0, 'await', NULL, 'upgrade-fixture', '2026-12-07 21:43:50.343071+00', '2026-12-07 21:43:50.348962+00');

INSERT INTO {{schema}}.lanes VALUES (0, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (1, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (2, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (3, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (4, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (5, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (6, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (7, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (8, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (9, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (10, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (11, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (12, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (13, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (14, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (15, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (16, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (17, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (18, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (19, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (20, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (21, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (22, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (23, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (24, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (25, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (26, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (27, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (28, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (29, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (30, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (31, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (32, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (33, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (34, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (35, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (36, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (37, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (38, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (39, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (40, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (41, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (42, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (43, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (44, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (45, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (46, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (47, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (48, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (49, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (50, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (51, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (52, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (53, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (54, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (55, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (56, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (57, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (58, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (59, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (60, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (61, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (62, NULL, 0);
INSERT INTO {{schema}}.lanes VALUES (63, NULL, 0);

INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (1, '733', DEFAULT, 'orders', 'k0', '\x7b226e223a20307d', NULL, NULL, NULL, '2026-12-07 21:43:50.224524+00', 1002629022446988158);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (2, '734', DEFAULT, 'orders', 'k1', '\x7b226e223a20317d', NULL, NULL, NULL, '2026-12-07 21:43:50.225718+00', 3569218958564354661);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (3, '735', DEFAULT, 'orders', 'k2', '\x7b226e223a20327d', NULL, NULL, NULL, '2026-12-07 21:43:50.226012+00', 1129766235582620411);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (4, '736', DEFAULT, 'orders', 'k0', '\x7b226e223a20337d', NULL, NULL, NULL, '2026-12-07 21:43:50.226457+00', 3073773891935195080);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (5, '737', DEFAULT, 'orders', 'k1', '\x7b226e223a20347d', NULL, NULL, NULL, '2026-12-07 21:43:50.226747+00', 4033983993711307985);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (6, '738', DEFAULT, 'orders', 'k2', '\x7b226e223a20357d', NULL, NULL, NULL, '2026-12-07 21:43:50.226997+00', 3056861762963522500);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (7, '739', DEFAULT, 'orders', 'k0', '\x7b226e223a20367d', NULL, NULL, NULL, '2026-12-07 21:43:50.227245+00', 177330945845934435);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (8, '740', DEFAULT, 'orders', 'k1', '\x7b226e223a20377d', NULL, NULL, NULL, '2026-12-07 21:43:50.227424+00', 3863430917035454956);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (9, '741', DEFAULT, 'orders', 'k2', '\x7b226e223a20387d', NULL, NULL, NULL, '2026-12-07 21:43:50.227596+00', 4360272360605275214);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (10, '742', DEFAULT, 'orders', 'k0', '\x7b226e223a20397d', NULL, NULL, NULL, '2026-12-07 21:43:50.227767+00', 3982213215987692921);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (11, '743', DEFAULT, 'orders', 'k1', '\x7b226e223a2031307d', NULL, NULL, NULL, '2026-12-07 21:43:50.227997+00', 4426897513596878839);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (12, '744', DEFAULT, 'orders', 'k2', '\x7b226e223a2031317d', NULL, NULL, NULL, '2026-12-07 21:43:50.228179+00', 2871855508134064073);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (13, '745', DEFAULT, 'orders', 'k0', '\x7b226e223a2031327d', NULL, NULL, NULL, '2026-12-07 21:43:50.228475+00', 1032511120382585604);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (14, '746', DEFAULT, 'orders', 'k1', '\x7b226e223a2031337d', NULL, NULL, NULL, '2026-12-07 21:43:50.228652+00', 1382898024242150035);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (15, '747', DEFAULT, 'orders', 'k2', '\x7b226e223a2031347d', NULL, NULL, NULL, '2026-12-07 21:43:50.228825+00', 563481996032758024);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (16, '748', DEFAULT, 'orders', 'k0', '\x7b226e223a2031357d', NULL, NULL, NULL, '2026-12-07 21:43:50.228996+00', 3255857649455029978);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (17, '749', DEFAULT, 'orders', 'k1', '\x7b226e223a2031367d', NULL, NULL, NULL, '2026-12-07 21:43:50.229165+00', 2715546894637787551);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (18, '750', DEFAULT, 'orders', 'k2', '\x7b226e223a2031377d', NULL, NULL, NULL, '2026-12-07 21:43:50.229323+00', 1103726937701744949);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (19, '751', DEFAULT, 'orders', 'k0', '\x7b226e223a2031387d', NULL, NULL, NULL, '2026-12-07 21:43:50.22952+00', 4169979274887040763);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (20, '752', DEFAULT, 'orders', 'k1', '\x7b226e223a2031397d', NULL, NULL, NULL, '2026-12-07 21:43:50.229744+00', 3520416079726319072);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (21, '753', DEFAULT, 'orders', 'k2', '\x7b226e223a2032307d', NULL, NULL, NULL, '2026-12-07 21:43:50.233812+00', 1086382056901939846);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (22, '754', DEFAULT, 'orders', 'k0', '\x7b226e223a2032317d', NULL, NULL, NULL, '2026-12-07 21:43:50.234039+00', 4422966334758256142);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (23, '755', DEFAULT, 'orders', 'k1', '\x7b226e223a2032327d', NULL, NULL, NULL, '2026-12-07 21:43:50.234247+00', 2094940127264029828);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (24, '756', DEFAULT, 'orders', 'k2', '\x7b226e223a2032337d', NULL, NULL, NULL, '2026-12-07 21:43:50.234444+00', 558646275881152163);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (25, '757', DEFAULT, 'orders', 'k0', '\x7b226e223a2032347d', NULL, NULL, NULL, '2026-12-07 21:43:50.23461+00', 806757566759071564);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (26, '758', DEFAULT, 'orders', 'k1', '\x7b226e223a2032357d', NULL, NULL, NULL, '2026-12-07 21:43:50.234768+00', 2552763823389768416);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (27, '759', DEFAULT, 'orders', 'k2', '\x7b226e223a2032367d', NULL, NULL, NULL, '2026-12-07 21:43:50.234925+00', 1186486389046207594);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (28, '760', DEFAULT, 'orders', 'k0', '\x7b226e223a2032377d', NULL, NULL, NULL, '2026-12-07 21:43:50.235083+00', 3058945901099905315);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (29, '761', DEFAULT, 'orders', 'k1', '\x7b226e223a2032387d', NULL, NULL, NULL, '2026-12-07 21:43:50.23524+00', 2872392812789901207);
INSERT INTO {{schema}}.outbox OVERRIDING SYSTEM VALUE VALUES (30, '762', DEFAULT, 'orders', 'k2', '\x7b226e223a2032397d', NULL, NULL, NULL, '2026-12-07 21:43:50.235393+00', 1110592756961876258);

INSERT INTO {{schema}}.retries VALUES (4, 32, 2, '2026-12-07 21:43:50.235545+00', 'earlier failure', '2026-12-07 21:43:50.235545+00', 3073773891935195080);

SELECT pg_catalog.setval('{{schema}}.flow_instances_id_seq', 14, true);

SELECT pg_catalog.setval('{{schema}}.flow_runners_key_seq', 1, true);

SELECT pg_catalog.setval('{{schema}}.flow_signals_id_seq', 2, true);

SELECT pg_catalog.setval('{{schema}}.outbox_id_seq', 30, true);
