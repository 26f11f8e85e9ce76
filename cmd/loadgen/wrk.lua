-- wrk.lua: cmd/loadgen's script for Debian's wrk (4.1, LuaJIT). It sets up
-- one row's request and prints one line of results for loadgen to read.
--
-- wrk runs this file in its main Lua state and once more in each thread's;
-- every state reads the same environment:
--   LOADGEN_METHOD      the request's method (unset: GET, or the URL's)
--   LOADGEN_BODY_FILE   a file holding the request's JSON body (unset: none)
--   LOADGEN_KEYS_FILE   a file of header values, one a line; each request
--                       carries the next one in LOADGEN_KEY_HEADER, round
--                       robin (unset: every request is the same one, which
--                       wrk then prepares once and never calls Lua for)
--   LOADGEN_KEY_HEADER  the header those values go in
--   LOADGEN_THREADS     wrk's -t: the threads start at evenly spaced keys
-- wrk's Lua sees threads, not connections: each thread walks the keys in
-- order, so its connections take them in turn and every key gets the same
-- share of a thread's requests. The requests are formatted once, in init.
--
-- Output, after wrk's own report, one line:
--   loadgen-wrk requests=<answers> duration_us=<µs> p50_us=<µs> p99_us=<µs>
--     connect=<n> read=<n> write=<n> status=<n> timeout=<n>
-- requests counts every answer, those with a status >= 400 too, which
-- status counts again; connect, read, write and timeout are the requests
-- that got no answer. Latencies are each answer's round trip.

local method = os.getenv("LOADGEN_METHOD")
local body_file = os.getenv("LOADGEN_BODY_FILE")
local keys_file = os.getenv("LOADGEN_KEYS_FILE")
local key_header = os.getenv("LOADGEN_KEY_HEADER") or "Authorization"

local function read_file(path)
   local f = assert(io.open(path, "rb"))
   local s = f:read("*a")
   f:close()
   return s
end

-- setup runs in the main state, once per thread, before the thread's init.
local threads_set_up = 0
function setup(thread)
   thread:set("loadgen_thread", threads_set_up)
   threads_set_up = threads_set_up + 1
end

local prepared, count, next_request = {}, 0, 1

-- prepare formats this thread's requests, one per key, starting at its
-- own place among them.
local function prepare()
   local keys = {}
   for line in io.lines(keys_file) do
      if line ~= "" then
         keys[#keys + 1] = line
      end
   end
   assert(#keys > 0, keys_file .. ": no keys")
   local threads = tonumber(os.getenv("LOADGEN_THREADS")) or 1
   local start = math.floor((loadgen_thread or 0) * #keys / threads)
   for i = 1, #keys do
      local headers = {}
      for name, value in pairs(wrk.headers) do
         headers[name] = value
      end
      headers[key_header] = keys[(start + i - 1) % #keys + 1]
      prepared[i] = wrk.format(nil, nil, headers)
   end
   count = #keys
end

function init(args)
   if method and method ~= "" then
      wrk.method = method
   end
   if body_file and body_file ~= "" then
      wrk.body = read_file(body_file)
      wrk.headers["Content-Type"] = "application/json"
   end
   if keys_file and keys_file ~= "" then
      prepare()
   end
end

-- request exists only with keys: wrk decides from the main state whether
-- it calls Lua for every request.
if keys_file and keys_file ~= "" then
   function request()
      local r = prepared[next_request]
      next_request = next_request % count + 1
      return r
   end
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "loadgen-wrk requests=%d duration_us=%d p50_us=%d p99_us=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
      summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
      e.connect, e.read, e.write, e.status, e.timeout))
end
