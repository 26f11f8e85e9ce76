-- A tier's upgrade_url is where a tenant buys that tier: the upgrade hint of
-- the tier below links to it. The seeded URLs pointed one tier too high
-- (Free's hint to Pro linked to "upgrade=enterprise"); fix those still unchanged.
UPDATE tiers SET upgrade_url = 'https://tollgate.example/pricing'
 WHERE slug = 'free' AND upgrade_url = 'https://tollgate.example/pricing?upgrade=pro';
UPDATE tiers SET upgrade_url = 'https://tollgate.example/pricing?upgrade=pro'
 WHERE slug = 'pro' AND upgrade_url = 'https://tollgate.example/pricing?upgrade=enterprise';
