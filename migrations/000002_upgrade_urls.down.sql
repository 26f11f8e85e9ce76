UPDATE tiers SET upgrade_url = 'https://tollgate.example/pricing?upgrade=enterprise'
 WHERE slug = 'pro' AND upgrade_url = 'https://tollgate.example/pricing?upgrade=pro';
UPDATE tiers SET upgrade_url = 'https://tollgate.example/pricing?upgrade=pro'
 WHERE slug = 'free' AND upgrade_url = 'https://tollgate.example/pricing';
