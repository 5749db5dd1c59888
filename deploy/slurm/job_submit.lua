--[[
stager's grant check at sbatch, for Slurm 22.05 (JobSubmitPlugins=lua in slurm.conf;
this file as job_submit.lua beside slurm.conf and burst_buffer.lua).

Slurm 22.05 runs burst_buffer.lua's slurm_bb_job_process without saying whose job it
is, so it can refuse only stager paths no one is granted; this plugin is told the
submitting user (job_desc.user_id, authenticated by munge) and runs the same check
for that user, so a job naming a path its user or groups hold no grant for is
rejected at sbatch with the directive's line and the reason. Slurm 23.02 and later
pass the user to slurm_bb_job_process themselves.

On every Slurm it also lets a job say `#STAGER capacity=SIZE` alone: Slurm takes a
capacity only with its pool named on the line (`pool=stager`), and this adds it.

A site with a job_submit.lua of its own dofile()s this one at its top (its own
slurm_job_submit, defined after, wins) and calls stager_job_submit(job_desc) from it.
--]]

local here = string.match(debug.getinfo(1, "S").source, "^@(.*)/[^/]*$") or "."
dofile(here .. "/burst_buffer.lua")     -- one home for the stager command and settings

-- The script with `pool=stager` added to each `#STAGER capacity=SIZE` line that names
-- no pool. Slurm reads a capacity only beside a pool on the same line (without one it
-- rejects the job: "Must specify pool with capacity"); stager has one pool, so a job
-- need not name it. Directive lines are those of the leading comment block, as Slurm
-- reads them (blank lines do not end it).
function stager_name_the_pool(script, word)
	local tag = "#" .. word
	local head, pos = {}, 1
	while pos <= #script do
		local stop = string.find(script, "\n", pos, true) or #script
		local line = string.sub(script, pos, stop)
		if not string.find(line, "^%s*$") and string.sub(line, 1, 1) ~= "#" then
			break                       -- the first command ends the directives
		end
		if string.sub(line, 1, #tag) == tag
				and string.find(line, "^%s+capacity=", #tag + 1)
				and not string.find(line, "pool=", 1, true) then
			line = tag .. " pool=stager" .. string.sub(line, #tag + 1)
		end
		table.insert(head, line)
		pos = stop + 1
	end
	return table.concat(head) .. string.sub(script, pos)
end

-- slurm.SUCCESS, or slurm.ERROR with the reason shown to the user.
function stager_job_submit(job_desc)
	local script = job_desc.script
	local word = stager_directive() or "STAGER"
	if script == nil or not string.find(script, "#" .. word, 1, true) then
		return slurm.SUCCESS            -- no directive: no stager start-up per sbatch
	end
	local named = stager_name_the_pool(script, word)
	if named ~= script then
		job_desc.script = named
		script = named
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
