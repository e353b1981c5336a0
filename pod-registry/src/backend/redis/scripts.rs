//! The Lua scripts: each runs atomically on the one key it is given, so it is
//! Cluster-safe.

/// Removes every expired entry of one hash, atomically: `exp:<id>` fields (a bare
/// expiry) go with their `conn:<id>` partner; other values are JSON objects with
/// `expires_at_ms`. Anything else is left alone. Returns how many entries went.
pub(super) const GC_SCRIPT: &str = r#"
local now = tonumber(ARGV[1])
local removed = 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f, v = all[i], all[i + 1]
  if string.sub(f, 1, 4) == 'exp:' then
    local exp = tonumber(v)
    if exp and exp <= now then
      redis.call('HDEL', KEYS[1], f, 'conn:' .. string.sub(f, 5))
      removed = removed + 1
    end
  elseif string.sub(f, 1, 5) ~= 'conn:' then
    local ok, d = pcall(cjson.decode, v)
    if ok and type(d) == 'table' then
      local exp = tonumber(d['expires_at_ms'])
      if exp and exp <= now then
        redis.call('HDEL', KEYS[1], f)
        removed = removed + 1
      end
    end
  end
end
return removed
"#;

/// Compare-and-set of the topology hash: applies field writes (empty value = delete)
/// only if `version` is still ARGV[1]; returns the new version, or -1 on conflict.
pub(super) const TOPOLOGY_CAS_SCRIPT: &str = r#"
local cur = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if cur ~= tonumber(ARGV[1]) then return -1 end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return redis.call('HINCRBY', KEYS[1], 'version', 1)
"#;
