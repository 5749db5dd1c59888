--[[
stager's grant check at sbatch, for Slurm 22.05 (JobSubmitPlugins=lua in slurm.conf;
this file as job_submit.lua beside slurm.conf and burst_buffer.lua).

Slurm 22.05 runs burst_buffer.lua's slurm_bb_job_process without saying whose job it
is, so it can refuse only stager paths no one is granted; this plugin is told the
submitting user (job_desc.user_id, authenticated by munge) and runs the same check
for that user, so a job naming a path its user or groups hold no grant for is
rejected at sbatch with the directive's line and the reason. Slurm 23.02 and later
pass the user to slurm_bb_job_process themselves: there this file is not needed.

A site with a job_submit.lua of its own dofile()s this one at its top (its own
slurm_job_submit, defined after, wins) and calls stager_job_submit(job_desc) from it.
--]]

local here = string.match(debug.getinfo(1, "S").source, "^@(.*)/[^/]*$") or "."
dofile(here .. "/burst_buffer.lua")     -- one home for the stager command and settings

-- slurm.SUCCESS, or slurm.ERROR with the reason shown to the user.
function stager_job_submit(job_desc)
	local script = job_desc.script
	local word = stager_directive() or "STAGER"
	if script == nil or not string.find(script, "#" .. word, 1, true) then
		return slurm.SUCCESS            -- no directive: no stager start-up per sbatch
	end
	local name = os.tmpname()           -- mkstemp: 0600, root's
	local file = io.open(name, "w")
	if not file then
		slurm.log_user("stager: cannot write %s", name)
		return slurm.ERROR
	end
	file:write(script)
	file:close()
	local rc, out = slurm_bb_job_process(name, job_desc.user_id, job_desc.group_id)
	os.remove(name)
	if rc ~= slurm.SUCCESS then
		slurm.log_user("%s", out or "stager: job_process failed")
	end
	return rc
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	return stager_job_submit(job_desc)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end
