--[[
stager's hooks for Slurm's burst_buffer/lua plugin (BurstBufferType=burst_buffer/lua).

Put this file, as burst_buffer.lua, beside slurm.conf and burst_buffer.conf. A job
script then asks for staging in its leading comment block:

    #STAGER stage_in  https://host/imagenet  /jobs/$SLURM_JOB_ID/in  [--include GLOB]
    #STAGER stage_out /jobs/$SLURM_JOB_ID/out  file:///project/results
    #STAGER stage_in  s3://bucket/vocab  /datasets/team-a/tmp-$SLURM_JOB_ID  --scratch
    #STAGER attach    s3://bucket/laion  /jobs/$SLURM_JOB_ID/laion  [--refresh SECONDS]
    #STAGER capacity=200GiB

(the word is burst_buffer.conf's Directive=; Slurm takes a capacity only with its pool
named, `pool=stager`, which job_submit.lua adds where a job leaves it out). Each hook
runs `stager slurm HOOK ARGS`, where the work is done (stager/stage/slurm.py); its exit
status becomes slurm.SUCCESS or slurm.ERROR and its output the message Slurm shows:
sbatch's error when a job is rejected, the reason of a held job. The cluster, the
jobs' directory and who may reach which stager paths ([grants]) are in the settings
file below (meta_url, token_file, ca_file, jobs_dir, state_dir, grants). Slurm 22.05
does not tell slurm_bb_job_process whose job it is: install job_submit.lua beside this
file too, so that a path the user holds no grant for rejects the job at sbatch
(without it, setup holds the job); on every Slurm it also names the pool of a
`capacity=` that names none.

Written for the Lua 5.1 that Slurm 22.05 links: a pipe's close() gives no exit
status, so the command's status is echoed after its output.
--]]

-- Settings: the stager command (a path, or e.g. "env PYTHONPATH=/src /venv/bin/python
-- -m stager"), and the hooks' settings file.
STAGER = "stager"
STAGER_CONFIG = "/etc/stager/slurm.toml"
-- End of settings.

local function quote(word)
	return "'" .. (string.gsub(tostring(word), "'", "'\\''")) .. "'"
end

-- burst_buffer.conf's Directive= (beside this script), so there is one place to set it.
local function directive()
	local source = debug.getinfo(1, "S").source
	local dir = string.match(source, "^@(.*)/[^/]*$")
	local conf = dir and io.open(dir .. "/burst_buffer.conf")
	if not conf then
		return nil
	end
	local word
	for line in conf:lines() do
		word = word or string.match(line, "^%s*[Dd]irective%s*=%s*(%S+)")
	end
	conf:close()
	return word
end
stager_directive = directive        -- for job_submit.lua

-- Hooks whose work must finish even when slurmctld kills the hook. scancel of a
-- pending job kills every script Slurm runs for it (its process group), and Slurm
-- runs no teardown again for one it killed: the teardown that Flags=TeardownFailure
-- starts when data_in fails, cut off by the scancel of the held job, left the job's
-- directory behind whenever the teardown that the scancel queues was killed too (a
-- race inside slurmctld, lost under load). In a session of its own stager's
-- teardown is out of that process group's reach; it is idempotent, and two of one
-- job take turns (stager/cli/slurmcmds.py).
local DETACHED = {teardown = true}

-- Run `stager slurm HOOK ARGS…`: slurm.SUCCESS or slurm.ERROR, and its output.
local function stager(hook, ...)
	local words = {STAGER, "slurm", hook, "--config", quote(STAGER_CONFIG)}
	if DETACHED[hook] then
		table.insert(words, 1, "setsid -w")
	end
	local word = directive()
	if word then
		table.insert(words, "--directive")
		table.insert(words, quote(word))
	end
	for i = 1, select("#", ...) do
		table.insert(words, quote(select(i, ...)))
	end
	local command = table.concat(words, " ") .. " 2>&1; echo \"__stager_rc=$?\""
	local pipe = io.popen(command)
	if not pipe then
		return slurm.ERROR, "cannot run " .. STAGER
	end
	local out = pipe:read("*a") or ""
	pipe:close()
	local rc = tonumber(string.match(out, "__stager_rc=(%d+)%s*$"))
	out = string.gsub(string.gsub(out, "__stager_rc=%d+%s*$", ""), "%s+$", "")
	if rc == 0 then
		slurm.log_debug("stager slurm %s: %s", hook, out)
		return slurm.SUCCESS, out
	end
	slurm.log_error("stager slurm %s failed (%s): %s", hook, tostring(rc), out)
	return slurm.ERROR, out
end

-- At sbatch time, in slurmctld: parse and check the directives (quick, offline). Slurm
-- 23.02 and later say whose job it is, and its grants are checked here; 22.05 does not
-- (job_submit.lua calls this with the submitting user instead).
function slurm_bb_job_process(job_script, uid, gid)
	local rc, out
	if uid ~= nil and gid ~= nil then
		rc, out = stager("job_process", job_script, uid, gid)
	else
		rc, out = stager("job_process", job_script)
	end
	if rc == slurm.SUCCESS then
		return rc
	end
	return rc, out
end

-- One pool, "stager": the cluster's free bytes, so that a job's `#STAGER capacity=SIZE`
-- waits until that much is free. Slurm asks again now and then.
function slurm_bb_pools()
	local rc, out = stager("pools")
	if rc ~= slurm.SUCCESS then       -- stager itself did not run: no room, but a pool
		return slurm.SUCCESS, '{"pools":[{"id":"stager","quantity":0,"granularity":1}]}'
	end
	return rc, out
end

function slurm_bb_setup(job_id, uid, gid, pool, bb_size, job_script)
	return stager("setup", job_id, uid, gid, pool or "", bb_size or "0", job_script)
end

-- While the job is pending: stage each stage_in into the cluster.
function slurm_bb_data_in(job_id, job_script)
	return stager("data_in", job_id, job_script)
end

function slurm_bb_real_size(job_id)
	return slurm.SUCCESS
end

-- STAGER_META_URL and STAGER_JOB_DIR into the job's environment.
function slurm_bb_paths(job_id, job_script, path_file)
	return stager("paths", job_id, job_script, path_file)
end

-- As the job starts and as it ends, stager has nothing to do: no stager start-up
-- (a second or more) on the way to the job's first step.
function slurm_bb_pre_run(job_id, job_script)
	return slurm.SUCCESS
end

function slurm_bb_post_run(job_id, job_script)
	return slurm.SUCCESS
end

-- After the job: stage each stage_out from the cluster to its destination.
function slurm_bb_data_out(job_id, job_script)
	return stager("data_out", job_id, job_script)
end

-- After the job, or when it is cancelled: remove its directory and --scratch copies.
function slurm_bb_job_teardown(job_id, job_script, hurry)
	return stager("teardown", job_id, job_script, hurry)
end

-- scontrol show bbstat [ARGS…]
function slurm_bb_get_status(...)
	return stager("status", ...)
end
